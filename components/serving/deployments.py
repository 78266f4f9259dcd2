"""The Serve deployments of the graph, as plain classes (:mod:`.app` applies ``serve.deployment``).

Each model-holding deployment loads its model in ``reconfigure(user_config)``, so a new artifact
version is swapped in by changing only the deployments' ``user_config`` in the Serve config and
deploying it again (:func:`components.serving.deploy.swap_artifact`): the running replicas load the
new version off the event loop, then replace the old one in a single assignment, and requests in
flight finish on the version they started with. Responses carry the version that answered.
Changing the app's ``args`` instead changes its code version, so Serve restarts the replicas.

Model calls go through ``@serve.batch`` (small batches, a short wait: the latency goal is tens of
milliseconds) and run in a worker thread so the replica's event loop keeps collecting the next
batch while torch / numpy compute.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray import serve

from components.serving.catalog import ToolCatalog, load_catalog
from components.serving.models import DetectorModel, RetrieverModel, named
from components.serving.rewriter import build_rewriter
from components.serving.selector import build_selector

logger = logging.getLogger("ray.serve")

BATCH_KEYS = ("max_batch_size", "batch_wait_timeout_s")


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """A user config without the batching keys (those go to :func:`_batching`)."""
    return {k: v for k, v in config.items() if k not in BATCH_KEYS}


def _batching(method: Any, config: dict[str, Any]) -> None:
    """Apply ``max_batch_size`` / ``batch_wait_timeout_s`` from a user config to a batched method."""
    if "max_batch_size" in config:
        method.set_max_batch_size(int(config["max_batch_size"]))
    if "batch_wait_timeout_s" in config:
        method.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))


class Detector:
    """P(needs a tool). User config: ``artifact``, ``detector_file``, ``calibration_data``, ``splits``."""

    def __init__(self) -> None:
        self.model: DetectorModel | None = None

    async def reconfigure(self, config: dict[str, Any]) -> None:
        settings = {k: config.get(k) for k in ("detector_file", "calibration_data", "splits")}
        self.model = await asyncio.to_thread(DetectorModel, config["artifact"], **settings)
        _batching(self.detect, config)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002)
    async def detect(self, queries: list[str]) -> list[dict[str, Any]]:
        model = self.model  # one version for the whole batch, even if a swap lands meanwhile
        assert model is not None, "reconfigure() loads the model before any request"
        probs = await asyncio.to_thread(model.probabilities, queries)
        return [{"probability": p, "version": model.version} for p in probs]


class QueryRewriter:
    """The rewriting slot (see :mod:`.rewriter`). User config: the ``rewriter`` section."""

    def __init__(self) -> None:
        self.rewriter: Any = None

    async def reconfigure(self, config: dict[str, Any]) -> None:
        self.rewriter = await asyncio.to_thread(build_rewriter, _settings(config))

    async def rewrite(self, query: str, history: list[str]) -> str:
        return await asyncio.to_thread(self.rewriter.rewrite, query, history)


class Retriever:
    """Ranks the catalog with any trained method's artifact. User config: ``artifact``.

    Args:
        catalog: Dataset dir whose corpus names the tools (artifacts store ids only).
    """

    def __init__(self, catalog: str) -> None:
        self.catalog: ToolCatalog = load_catalog(catalog)
        self.model: RetrieverModel | None = None

    async def reconfigure(self, config: dict[str, Any]) -> None:
        self.model = await asyncio.to_thread(RetrieverModel, config["artifact"])
        _batching(self.retrieve, config)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002)
    async def retrieve(self, requests: list[tuple[str, int]]) -> list[dict[str, Any]]:
        """One ``(text, k)`` per request; the batch is ranked once at the largest ``k``."""
        model = self.model
        assert model is not None, "reconfigure() loads the model before any request"
        k = max(k for _, k in requests)
        rankings = await asyncio.to_thread(model.retrieve, [t for t, _ in requests], k)
        return [
            {"tools": named(r[:k_i], self.catalog), "version": model.version}
            for r, (_, k_i) in zip(rankings, requests, strict=True)
        ]

    async def info(self) -> dict[str, Any]:
        model = self.model
        assert model is not None
        return {"size": model.size(), "model_version": model.version, "catalog_version": self.catalog.version}


class Selector:
    """Picks the call among the candidates (see :mod:`.selector`). User config: the ``selector`` section.

    Args:
        catalog: Dataset dir with the tools' parameter schemas.
    """

    def __init__(self, catalog: str) -> None:
        self.catalog = load_catalog(catalog)
        self.backend: Any = None

    async def reconfigure(self, config: dict[str, Any]) -> None:
        self.backend = await asyncio.to_thread(build_selector, _settings(config), self.catalog)
        _batching(self.select, config)

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.002)
    async def select(self, requests: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        """One ``{"query", "history", "candidates"}`` per request; decoded one after the other, since
        each request constrains decoding to its own candidates."""
        backend = self.backend
        if backend is None:
            return [None] * len(requests)

        def one(r: dict[str, Any]) -> dict[str, Any] | None:
            try:
                return backend.select(r["query"], r["history"], r["candidates"])
            except Exception:  # one bad decode must not drop the other requests of the batch
                logger.exception("selector failed on one request; answering it without a call")
                return None

        return await asyncio.to_thread(lambda: [one(r) for r in requests])
