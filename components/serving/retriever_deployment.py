"""The Retriever deployment: ranks the catalog with any method's artifact, and keeps the catalog live.

Artifacts store tool ids only; the names, descriptions and schemas a client sees come from the
catalog (a dataset's corpus, :mod:`.catalog`). That corpus changes under a running server when
``toolscout ingest mcp`` runs again: tools are added, updated in place, or retired. The user config
therefore carries ``catalog_version`` (the corpus's content hash, written by
:func:`components.serving.app.user_configs`); when it differs from the loaded catalog, the replica
reads the corpus again in ``reconfigure``, with no restart
(:func:`components.serving.swap.refresh_catalog` deploys it). A tool the artifact knows but the
catalog no longer lists is retired: it is never answered, and the ranking is filled from further
down so a request still gets ``k`` tools. (New tools reach answers when the artifact is indexed
again over the new corpus and swapped in; until then the catalog describes them for ``get_tool``.)
"""

from __future__ import annotations

import asyncio
import logging
import os
from functools import partial
from typing import Any

from ray import serve

from components.serving.answer_cache import AnswerCache, normalise_query
from components.serving.batch_calls import (
    applied_already,
    apply_batching,
    apply_failed,
    load_new,
    raise_failed,
    rank_by_k,
    usable_config,
)
from components.serving.catalog import ToolCatalog, load_catalog
from components.serving.deployments import DEFAULT_CACHE_SIZE, reread_catalog
from components.serving.models import DEFAULT_ENCODER_RUNTIME, Ranking, RetrieverModel, named, top_score

logger = logging.getLogger("ray.serve")


def retired(model: RetrieverModel, catalog: ToolCatalog) -> frozenset[str]:
    """The artifact's tool ids the catalog no longer lists."""
    return frozenset(t for t in model.method.tool_ids if t not in catalog.tools)


def listed(ranking: Ranking | Exception, gone: frozenset[str], k: int) -> Ranking | Exception:
    """``ranking`` without retired tools, cut to ``k``."""
    if isinstance(ranking, Exception) or not gone:
        return ranking
    return [(t, s) for t, s in ranking if t not in gone][:k]


def rank_without_retired(
    model: RetrieverModel, requests: list[tuple[str, int]], gone: frozenset[str]
) -> list[tuple[Ranking, float, float | None] | Exception]:
    """Each ``(text, k)``'s top ``k`` among the tools still listed (retired ones dropped), with what
    a detector of the same artifact decides from (:meth:`Detector.detect_scored`): the top score
    among all the artifact's tools (retired ones included, 0 for an empty ranking), and the
    probability the method's own detector gave in the same pass (``None`` if it has none).

    A request first asks for ``k`` more at most (``2k``): asking for ``k + len(gone)`` every time
    would make a catalog with hundreds of retired tools decode hundreds of beams per ToolGen
    request. Only a request that this leaves short (and whose ranking went that deep) asks again
    for ``k + len(gone)``, which always leaves ``k`` if the catalog has them.
    """
    first = [(text, k + min(len(gone), k)) for text, k in requests]
    ranked = rank_by_k(model.retrieve_detected, first)
    raw = [r if isinstance(r, Exception) else r[0] for r in ranked]
    out = [listed(r, gone, k) for r, (_, k) in zip(raw, requests, strict=True)]
    short = [
        i
        for i, (ranking, (_, k)) in enumerate(zip(raw, requests, strict=True))
        # short of k after the drop, and the ranking went as deep as asked: there may be more
        if not isinstance(ranking, Exception) and len(ranking) >= first[i][1] and len(out[i]) < k
    ]
    if short:
        again = rank_by_k(model.retrieve, [(requests[i][0], requests[i][1] + len(gone)) for i in short])
        for i, ranking in zip(short, again, strict=True):
            out[i] = listed(ranking, gone, requests[i][1])
    return [
        o if isinstance(o, Exception) else (o, top_score(r[0]), r[1])
        for o, r in zip(out, ranked, strict=True)
    ]


class Retriever:
    """Ranks the catalog with any trained method's artifact. User config: ``artifact``,
    ``cache_size`` (answers kept, see :mod:`.answer_cache`), ``catalog_version`` (reload the catalog
    when it changed), ``encoder_runtime`` (where a dense or MassTool encoder runs), ``lm_engine``
    (where a ToolGen or ToolWeaver decoder runs; unset: as the artifact was saved) and ``lm_endpoint``
    (the vLLM server of its LM, for ``lm_engine: vllm``).

    Args:
        catalog: Dataset dir whose corpus names the tools (artifacts store ids only).
    """

    def __init__(self, catalog: str) -> None:
        self.catalog_path = catalog
        self.catalog: ToolCatalog = load_catalog(catalog)
        self.model: RetrieverModel | None = None
        self.retired: frozenset[str] = frozenset()
        self.cache: AnswerCache[dict[str, Any]] = AnswerCache(DEFAULT_CACHE_SIZE)

    async def reconfigure(self, config: dict[str, Any]) -> None:
        if applied_already(self, config):
            return  # Serve re-sends it on a rank change: nothing to load (see applied_already)
        if not usable_config("Retriever", self, config, serving=self.model is not None):
            return
        self.cache.resize(int(config.get("cache_size", DEFAULT_CACHE_SIZE)))
        wanted = config.get("catalog_version")
        if wanted is not None and wanted != self.catalog.version:
            await self._reload_catalog(wanted)
        runtime = config.get("encoder_runtime", DEFAULT_ENCODER_RUNTIME)
        load = partial(
            RetrieverModel,
            config["artifact"],
            runtime,
            config.get("lm_engine"),
            config.get("lm_endpoint"),
            source=config.get("source"),  # a pinned registry version, for a node without its dir
            registry=config.get("registry"),
        )
        loaded, model = await load_new("Retriever", load, serving=self.model is not None)
        if loaded:
            self.model = model
            self.retired = retired(model, self.catalog)
            self.cache.clear()  # the new version answers from scratch
            apply_batching(self._retrieve_batch, config)
        else:
            apply_failed(self)

    async def _reload_catalog(self, wanted: str) -> None:
        """Read the corpus again; on failure keep serving the catalog already loaded."""
        catalog = await reread_catalog("Retriever", self.catalog_path, wanted)
        if catalog is None:
            apply_failed(self)  # the same config again (a rank change) tries the catalog anew
            return
        self.catalog = catalog
        if self.model is not None:
            self.retired = retired(self.model, catalog)
        self.cache.clear()  # answers carry the old names

    async def retrieve(self, request: tuple[str, int]) -> dict[str, Any]:
        """``{"tools", "version", "catalog_version", "ranking", "top_score", "detected"}`` for one
        ``(text, k)`` (the last three: see :func:`rank_without_retired`; batched with concurrent
        ones; a repeat of a recent request is answered from the cache)."""
        model = self.model
        assert model is not None, "reconfigure() loads the model before any request"
        text, k = normalise_query(request[0]), request[1]  # what the model sees, cached or not
        found = self.cache.get((model.version, self.catalog.version, text, k))
        if found is not None:
            return found
        generation = self.cache.generation
        answer = raise_failed(await self._retrieve_batch((text, k)))
        # Keyed by what answered, and stored only if no swap or catalog reload cleared the cache
        # meanwhile: two loads can share a version string (the same directory, another runtime).
        self.cache.put((answer["version"], answer["catalog_version"], text, k), answer, generation)
        return answer

    async def cache_stats(self) -> dict[str, int]:
        """This replica's answer cache: ``{"size", "entries", "hits", "misses"}``."""
        return self.cache.stats()

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)
    async def _retrieve_batch(self, requests: list[tuple[str, int]]) -> list[dict[str, Any] | Exception]:
        model, catalog, gone = self.model, self.catalog, self.retired  # one version for the batch
        assert model is not None, "reconfigure() loads the model before any request"
        rankings = await asyncio.to_thread(rank_without_retired, model, requests, gone)
        out: list[dict[str, Any] | Exception] = []
        for r in rankings:
            if isinstance(r, Exception):
                out.append(r)
                continue
            ranking, top, detected = r
            versions = {"version": model.version, "catalog_version": catalog.version}
            # For the ingress only (never sent to clients): what a detector of the same artifact
            # decides from (see rank_without_retired).
            decides = {"ranking": model.ranking, "top_score": top, "detected": detected}
            out.append({"tools": named(ranking, catalog), **versions, **decides})
        return out

    async def serving_artifact(self) -> str:
        """The artifact directory this replica answers with (a pinned version, never a URI)."""
        model = self.model
        assert model is not None
        return model.artifact

    async def serving_version(self) -> str:
        """What redeploys this replica's version on any node: its registry version
        (``models:/<name>/<N>``) when it is one, else its directory (which every node must have)."""
        model = self.model
        assert model is not None
        return model.source or model.artifact

    async def working_dir(self) -> str:
        """Where this replica (and the app's build, in the same runtime env) reads relative paths."""
        return os.getcwd()

    async def serving_catalog(self) -> str:
        """The version (content hash) of the catalog this replica answers with."""
        return self.catalog.version

    async def info(self) -> dict[str, Any]:
        model = self.model
        assert model is not None
        # The tools an answer can name: the artifact's, less those the catalog retired since.
        size = model.size() - len(self.retired)
        return {"size": size, "model_version": model.version, "catalog_version": self.catalog.version}

    async def describe(self, tool_ids: list[str]) -> list[dict[str, Any] | None]:
        """Name, description and input schema of each tool id (None for an id not in the catalog)."""
        return [self.catalog.describe(t) for t in tool_ids]

    async def lookup(self, key: str) -> list[dict[str, Any]]:
        """The tool with id ``key``, else every tool named ``key`` (see ``ToolCatalog.lookup``)."""
        return self.catalog.lookup(key)
