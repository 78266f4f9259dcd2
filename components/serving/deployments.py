"""The Serve deployments of the graph, as plain classes (:mod:`.app` applies ``serve.deployment``).

Each model-holding deployment loads its model in ``reconfigure(user_config)``, so a new artifact
version is swapped in by changing only the deployments' ``user_config`` in the Serve config and
deploying it again (:func:`components.serving.swap.swap_artifact`): the running replicas load the
new version off the event loop, then replace the old one in a single assignment, and requests in
flight finish on the version they started with. Responses carry the version that answered. A
version that fails to load is logged and the replica keeps serving the one it has (see
:func:`.batch_calls.load_new`); only a replica's first load fails it. Changing the app's ``args``
instead changes its code version, so Serve restarts the replicas.

Model calls go through ``@serve.batch`` (small batches, no wait for partners: see
:data:`BATCH_KEYS`) and run in a worker thread so the replica's event loop keeps collecting the
next batch while torch / numpy compute. A batch answers each request as it would be answered alone
(each distinct ``k`` ranked apart; a failed call retried item by item: :mod:`.batch_calls`). The
Detector and the Retriever answer a repeated query from an LRU cache keyed by model version
(:mod:`.answer_cache`). The Retriever, which also keeps the catalog live, is in :mod:`.retriever_deployment`.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from ray import serve

from components.generative.deadline import DeadlinePassed, deadline
from components.serving.answer_cache import AnswerCache, normalise_query
from components.serving.batch_calls import (
    applied_already,
    apply_batching,
    apply_failed,
    call_each,
    load_new,
    raise_failed,
    usable_config,
)
from components.serving.catalog import ToolCatalog, load_catalog
from components.serving.models import DEFAULT_ENCODER_RUNTIME, DetectorModel, same_ranking
from components.serving.rewriter import build_rewriter, rewriter_settings
from components.serving.selector import DEFAULT_SELECT_DEADLINE_S, build_selector

logger = logging.getLogger("ray.serve")

BATCH_KEYS = ("max_batch_size", "batch_wait_timeout_s")
# Answers kept per Detector / Retriever replica (user config ``cache_size``; 0 turns it off): a
# query and a short answer (a probability, or k tool ids and scores) each, about a megabyte in all.
DEFAULT_CACHE_SIZE = 4096
# Batches do not wait for partners (batch_wait_timeout_s 0) and hold up to 8: requests that arrive
# while a batch runs still form the next one. Chosen by benchmarks/serve_batching.py over sizes 1/8/16
# and waits 0/2/10 ms on BM25 and MiniLM (results/serve_batching.md): a wait cost BM25's single client
# 11.3 -> 16.9 ms (2 ms) and 33.1 ms (10 ms), and no setting moved MiniLM's 8-client req/s beyond
# run-to-run noise. A GPU model that needs full batches can set a wait in the config's `batching`.


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """A user config without the batching keys (those go to :func:`_batching`)."""
    return {k: v for k, v in config.items() if k not in BATCH_KEYS}


async def reread_catalog(deployment: str, path: str, wanted: str) -> ToolCatalog | None:
    """The catalog at ``path`` read again for a changed ``catalog_version``, or ``None`` if that
    fails (the caller keeps the catalog it has; the failure is logged)."""
    loaded, catalog = await load_new(f"{deployment} catalog", partial(load_catalog, path), True)
    if not loaded:
        return None
    if catalog.version != wanted:  # the corpus changed again since the config was built
        logger.warning(
            "catalog %s is at %s, not %s as configured: serving what is there", path, catalog.version, wanted
        )
    logger.info(
        "%s: catalog %s reloaded: version %s, %d tools", deployment, path, catalog.version, len(catalog)
    )
    return catalog


class Detector:
    """P(needs a tool). User config: ``artifact``, ``detector_file``, ``calibration_data``, ``splits``,
    ``cache_size`` (answers kept, see :mod:`.answer_cache`), ``encoder_runtime``, ``lm_engine`` and
    ``lm_endpoint`` (as the Retriever's)."""

    def __init__(self) -> None:
        self.model: DetectorModel | None = None
        self.cache: AnswerCache[dict[str, Any]] = AnswerCache(DEFAULT_CACHE_SIZE)

    async def reconfigure(self, config: dict[str, Any]) -> None:
        if applied_already(self, config):
            return  # Serve re-sends it on a rank change: nothing to load (see applied_already)
        if not usable_config("Detector", self, config, serving=self.model is not None):
            return
        keys = ("detector_file", "calibration_data", "splits", "source", "registry")
        settings = {k: config.get(k) for k in (*keys, "lm_engine", "lm_endpoint")}
        settings["encoder_runtime"] = config.get("encoder_runtime", DEFAULT_ENCODER_RUNTIME)
        self.cache.resize(int(config.get("cache_size", DEFAULT_CACHE_SIZE)))
        load = partial(DetectorModel, config["artifact"], **settings)
        loaded, model = await load_new("Detector", load, serving=self.model is not None)
        if loaded:
            self.model = model
            self.cache.clear()  # the new version answers from scratch
            apply_batching(self._detect_batch, config)
        else:
            apply_failed(self)

    async def detect(self, query: str) -> dict[str, Any]:
        """``{"probability", "threshold", "version", "reads_ranking_of"}`` for one query (batched with
        concurrent ones; a repeat of a recent query is answered from the cache)."""
        model = self.model
        assert model is not None, "reconfigure() loads the model before any request"
        query = normalise_query(query)  # what the model sees, cached or not
        found = self.cache.get((model.version, query))
        if found is not None:
            return found
        generation = self.cache.generation
        answer = raise_failed(await self._detect_batch(query))
        # Stored only if no swap cleared the cache meanwhile: the answer may be the old model's.
        self.cache.put((answer["version"], query), answer, generation)
        return answer

    async def detect_scored(
        self, query: str, top_score: float, detected: float | None, ranking: str | None
    ) -> dict[str, Any]:
        """As :meth:`detect`, from what the Retriever computed while ranking ``query`` with
        ``ranking`` (:func:`.models.ranking_key`; ``top_score`` and its method's own ``detected``
        probability, see :func:`.retriever_deployment.rank_without_retired`): when this replica
        decides from that very answer (:attr:`DetectorModel.reads_ranking_of`) the query is not encoded again;
        otherwise (a swap landed in between, another artifact or runtime) it is detected as by
        :meth:`detect`."""
        model = self.model
        assert model is not None, "reconfigure() loads the model before any request"
        if same_ranking(model.reads_ranking_of, ranking):
            probability = model.probability_from(top_score, detected)
            if probability is not None:
                return model.answer(probability)
        return await self.detect(query)

    async def cache_stats(self) -> dict[str, int]:
        """This replica's answer cache: ``{"size", "entries", "hits", "misses"}``."""
        return self.cache.stats()

    async def serving_artifact(self) -> str:
        """The artifact directory this replica detects with (a pinned version, never a URI)."""
        model = self.model
        assert model is not None, "reconfigure() loads the model before any request"
        return model.artifact

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)
    async def _detect_batch(self, queries: list[str]) -> list[dict[str, Any] | Exception]:
        model = self.model  # one version for the whole batch, even if a swap lands meanwhile
        assert model is not None, "reconfigure() loads the model before any request"
        probs = await asyncio.to_thread(call_each, model.probabilities, queries)
        return [p if isinstance(p, Exception) else model.answer(p) for p in probs]


class QueryRewriter:
    """The rewriting slot (see :mod:`.rewriter`). User config: the ``rewriter`` section, plus
    ``timeout_s`` (past it a request is answered with its own query, so a slow generator never
    fails a request) and ``cache_size`` (an LRU of recent (query, history) rewrites, emptied when a
    new rewriter loads; changing only these two keeps the loaded model and its cache)."""

    def __init__(self) -> None:
        self.rewriter: Any = None
        self.settings: dict[str, Any] = {}
        self.timeout_s = 2.0
        self.cache: AnswerCache[str] = AnswerCache(1024)

    async def reconfigure(self, config: dict[str, Any]) -> None:
        if applied_already(self, config):
            return  # Serve re-sends it on a rank change: nothing to load (see applied_already)
        settings = _settings(config)
        self.timeout_s = float(settings.get("timeout_s", 2.0))
        self.cache.resize(int(settings.get("cache_size", 1024)))
        settings = rewriter_settings(settings)
        apply_batching(self._rewrite_batch, config)
        if self.rewriter is not None and settings == self.settings:
            return  # only the timeout, cache size or batching changed: keep the model and its cache
        load = partial(build_rewriter, settings)
        loaded, rewriter = await load_new("QueryRewriter", load, serving=self.rewriter is not None)
        if loaded:
            self.rewriter, self.settings = rewriter, settings
            self.cache.clear()
        else:
            apply_failed(self)

    async def rewrite(self, query: str, history: list[str]) -> str:
        """The rewrite of ``query`` (cached), or ``query`` itself when it takes over ``timeout_s``."""
        key = (query, tuple(history))
        found = self.cache.get(key)
        if found is not None:
            return found
        generation = self.cache.generation
        try:
            text = raise_failed(
                await asyncio.wait_for(self._rewrite_batch((query, list(history))), self.timeout_s)
            )
        except TimeoutError:
            logger.warning("rewrite took over %.2f s; retrieving with the query as sent", self.timeout_s)
            return query
        except Exception as e:  # a generator that fails (an endpoint down) must not fail the request
            logger.warning("rewrite failed (%s: %s); retrieving with the query as sent", type(e).__name__, e)
            return query  # not cached: the next request tries the generator again
        self.cache.put(key, text, generation)  # not if a new rewriter loaded meanwhile
        return text

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)
    async def _rewrite_batch(self, requests: list[tuple[str, list[str]]]) -> list[str | Exception]:
        rewriter = self.rewriter  # one version for the whole batch
        # Every request of the batch has stopped waiting by timeout_s from now: decoding stops then
        # too, rather than hold the cores (and the next batch) for an answer nobody reads.
        with deadline(self.timeout_s):
            return await asyncio.to_thread(call_each, rewriter.rewrite_many, requests)


async def select_all(backend: Any, requests: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """The call for each ``{"query", "history", "candidates"}``; ``None`` where the backend failed.

    Backends that wait on the network (``concurrent_calls``: an OpenAI-compatible endpoint) are
    called concurrently, so a batch takes about as long as its slowest call; a local LM decodes one
    request after the other, since parallel decodes would only contend for the same cores.
    """

    def one(r: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return backend.select(r["query"], r["history"], r["candidates"])
        except DeadlinePassed:
            return None  # its caller answered without a call already (Selector.deadline_s)
        except Exception:  # one bad decode must not drop the other requests of the batch
            logger.exception("selector failed on one request; answering it without a call")
            return None

    if backend.concurrent_calls:
        return list(await asyncio.gather(*(asyncio.to_thread(one, r) for r in requests)))
    return await asyncio.to_thread(lambda: [one(r) for r in requests])


class Selector:
    """Picks the call among the candidates (see :mod:`.selector`). User config: the ``selector``
    section, plus ``catalog_version`` (the corpus's content hash, as the Retriever gets it: when
    it changes the catalog is read again, so a tool the Retriever now ranks can be called, with
    the parameter schema it has now) and ``deadline_s`` (default 30: a call not chosen by then is
    answered as none, and the ranking goes back alone).

    Args:
        catalog: Dataset dir with the tools' parameter schemas.
    """

    def __init__(self, catalog: str) -> None:
        self.catalog_path = catalog
        self.catalog = load_catalog(catalog)
        self.backend: Any = None
        self.configured = False  # backend None is a configuration too (``backend: none``)
        self.deadline_s = DEFAULT_SELECT_DEADLINE_S

    async def reconfigure(self, config: dict[str, Any]) -> None:
        if applied_already(self, config):
            return  # Serve re-sends it on a rank change: nothing to load (see applied_already)
        settings = _settings(config)
        self.deadline_s = float(settings.pop("deadline_s", DEFAULT_SELECT_DEADLINE_S))
        wanted = settings.pop("catalog_version", None)
        stale = False  # the backend below is built over the catalog read now
        if wanted is not None and wanted != self.catalog.version:
            catalog = await reread_catalog("Selector", self.catalog_path, wanted)
            self.catalog, stale = catalog or self.catalog, catalog is None
        load = partial(build_selector, settings, self.catalog)
        loaded, backend = await load_new("Selector", load, serving=self.configured)
        if loaded:
            self.backend, self.configured = backend, True
            batching = dict(config)
            if backend is not None and not backend.concurrent_calls:
                # A local LM decodes a batch's requests one after the other, and Serve answers a
                # batch only when all of it is done: batched, each call waited for its batch-mates'
                # decodes too (four of ~8 s each passed a 30 s deadline together). One at a time.
                batching["max_batch_size"] = 1
            apply_batching(self._select_batch, batching)
        if stale or not loaded:  # serves on as it was; the same config again tries anew
            apply_failed(self)

    async def serving_catalog(self) -> str:
        """The version (content hash) of the catalog this replica's calls are built from."""
        return self.catalog.version

    async def select(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The call for one ``{"query", "history", "candidates"}``, or None past ``deadline_s``
        (a stalled endpoint or a long decode must not hold the answer; the decode stops then too)."""
        try:
            return await asyncio.wait_for(self._select_batch(request), self.deadline_s)
        except TimeoutError:
            logger.warning("selector took over %.2f s; answering with the ranking only", self.deadline_s)
            return None

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.0)
    async def _select_batch(self, requests: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        """One ``{"query", "history", "candidates"}`` per request; each constrains decoding to its own
        candidates, so requests are decoded separately (see :func:`select_all`)."""
        backend = self.backend
        if backend is None:
            return [None] * len(requests)
        with deadline(self.deadline_s):  # as the rewriter's: no decoding past the last waiter
            return await select_all(backend, requests)
