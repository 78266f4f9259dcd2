"""The HTTP ingress: FastAPI routes that chain the model deployments through their handles.

``POST /v1/select`` runs detection; when no tool is needed it answers at once (retrieval skipped),
otherwise it rewrites (if a rewriter is deployed), retrieves, and selects (if a selector is
deployed). A detector of the artifact the Retriever serves decides from what the Retriever computed
while ranking the query (the top score a threshold reads; MassTool's detection tower, which shares
its pass) instead of encoding the query a second time (:meth:`Ingress._detect_and_retrieve`).
Calls to replicas that die mid-request (a node loss, a killed actor) are retried on another
replica; they are all idempotent reads. The response names the version of each model that
answered (``versions``): Detector and Retriever reconfigure independently during a hot-swap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI
from mcp import types
from mcp.shared.exceptions import MCPError
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from components.generative.chat_endpoint import EndpointUnavailable
from components.generative.deadline import DeadlinePassed
from components.serving.body_limit import BodyLimit
from components.serving.errors import (
    API_KEY_ENV,
    ApiKeyMiddleware,
    error,
    install_error_handlers,
    require_json,
)
from components.serving.mcp_endpoint import ToolSearchEndpoint
from components.serving.models import same_ranking
from components.serving.origin import ORIGINS_ENV, OriginGuard
from components.serving.schemas import ERRORS, Health, SelectRequest, SelectResponse, ToolsInfo

logger = logging.getLogger("ray.serve")

# Failures of the replica rather than of the request: worth one more try on another replica.
RETRYABLE = (RayActorError, ReplicaUnavailableError, DeploymentUnavailableError)
MODEL_SERVER_DOWN = (EndpointUnavailable, DeadlinePassed)
CALL_TIMEOUT_S = 120.0  # one deployment call (a selector's or rewriter's own deadline is shorter)

# The MCP door (``find_tools`` / ``get_tool`` at ``/mcp/``): one per replica, bound to this replica's
# Ingress when Serve constructs it; its session manager runs for the life of the app.
mcp = ToolSearchEndpoint()
api = FastAPI(
    title="toolscout",
    summary="Online tool selection: detection → retrieval → LLM selection, on Ray Serve.",
    version="1",
    lifespan=lambda app: mcp.lifespan(),
)
api.mount("/mcp", mcp.app)
# Everything but liveness and the API docs needs the key (when one is set), whatever the prefix.
DOCS_PATHS = (api.docs_url, api.swagger_ui_oauth2_redirect_url, api.redoc_url, api.openapi_url)
PUBLIC_PATHS = frozenset(p for p in ("/healthz", *DOCS_PATHS) if p)
api.add_middleware(BodyLimit)  # inside the key check: a refused client's body is never read
api.add_middleware(ApiKeyMiddleware, public=PUBLIC_PATHS)
api.add_middleware(OriginGuard)  # outermost: a rebinding page learns nothing, not even a 401
install_error_handlers(api)


class BackendUnavailable(Exception):
    """A deployment kept failing after the retries."""


async def _for_mcp(work: Awaitable[Any]) -> Any:
    """``work``'s result; a backend down is the MCP door's internal error (the HTTP door's 503)."""
    try:
        return await work
    except BackendUnavailable as e:
        raise MCPError(types.INTERNAL_ERROR, f"backend unavailable: {e}") from e


class Ingress:
    """Routes of :data:`api`; handles are injected by :func:`components.serving.app.build_app`.

    Args:
        detector, retriever: Handles of the Detector and Retriever deployments.
        rewriter, selector: Handles of the optional deployments, or ``None`` when not deployed.
        needs_tool_threshold: Default probability above which a request needs a tool; ``None``
            uses the threshold the detector reports (the artifact's own, as evaluation uses).
        retries: Extra attempts on a replica failure.
        api_key: The app's API key, if it has one; it becomes ``$TOOLSCOUT_API_KEY`` of this
            replica, which :class:`~components.serving.errors.ApiKeyMiddleware` reads when Serve
            builds the app after this constructor. ``None`` keeps the replica's own (e.g. from a
            Kubernetes Secret).
        share_ranking: Let a detector of the retriever's artifact decide from the retriever's
            answer (see :meth:`_detect_and_retrieve`); False encodes each query twice.
        allowed_origins: Web origins whose pages may call the app, besides loopback ones; they
            become ``$TOOLSCOUT_ALLOWED_ORIGINS`` (:mod:`components.serving.origin`) as the key does.
        call_timeout_s: How long one call to a deployment may take before the request is
            answered 503 (a replica stuck in a model call still passes its health checks).
    """

    def __init__(
        self,
        detector: DeploymentHandle,
        retriever: DeploymentHandle,
        rewriter: DeploymentHandle | None = None,
        selector: DeploymentHandle | None = None,
        needs_tool_threshold: float | None = None,
        retries: int = 3,
        api_key: str | None = None,
        share_ranking: bool = True,
        allowed_origins: list[str] | None = None,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        self.call_timeout_s = call_timeout_s
        if api_key:
            os.environ[API_KEY_ENV] = api_key
        if allowed_origins:
            os.environ[ORIGINS_ENV] = ",".join(allowed_origins)
        self.detector, self.retriever = detector, retriever
        self.rewriter, self.selector = rewriter, selector
        self.threshold = needs_tool_threshold
        self.retries = retries
        # What the last answers said: the artifact whose ranking the detector can decide from, and
        # the one the retriever ranks with. When they are the same (and no rewriter changes the
        # text retrieved), one ranking answers both stages (see _detect_and_retrieve).
        self.reads_ranking_of: str | None = None
        self.retrieved_with: str | None = None
        self.share_ranking = share_ranking and rewriter is None
        mcp.bind(self._mcp_select, self._describe, self._lookup)

    async def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        for attempt in range(self.retries + 1):
            try:
                return await asyncio.wait_for(method.remote(*args), self.call_timeout_s)
            except TimeoutError as e:
                # Without a bound a client waited forever on a replica stuck in a model call.
                logger.error("a model deployment took over %.0f s: %s", self.call_timeout_s, method)
                raise BackendUnavailable(
                    f"a model deployment did not answer within {self.call_timeout_s:g} s; try again"
                ) from e
            except MODEL_SERVER_DOWN as e:
                # A Retriever or Detector whose LM runs on an endpoint (vLLM) that does not answer:
                # the service is unavailable (503), not broken (500); another replica would ask
                # the same endpoint, so no retry. (Ray's wrapped error is also the cause's type.)
                logger.error("a model server did not answer: %s", e)
                raise BackendUnavailable("a model server did not answer; try again") from e
            except RETRYABLE as e:
                if attempt == self.retries:
                    # Ray's message names the node's IP, the actor, its PID: for the log, not the client.
                    logger.error("a model deployment failed %d times: %s", self.retries + 1, e)
                    raise BackendUnavailable(
                        f"a model deployment did not answer after {self.retries + 1} tries; try again"
                    ) from e
                logger.warning("retrying after replica failure: %s", type(e).__name__)
                await asyncio.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    @staticmethod
    async def _timed(timings: dict[str, float], stage: str, call: Awaitable[Any]) -> Any:
        start = time.perf_counter()
        try:
            return await call
        finally:
            timings[stage] = round((time.perf_counter() - start) * 1000, 3)

    async def _detect_and_retrieve(
        self, req: SelectRequest, timings: dict[str, float]
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The detector's answer and, when the query was ranked on the way, the retriever's.

        Detection and retrieval encode the same query: a score-threshold detector (dense, BM25)
        ranks it to read its top score, and MassTool's detection tower reads the joint embedding
        its retrieval tower scores. When the Detector and the Retriever rank with the same
        artifact on the same runtime (:func:`.models.ranking_key`) and the query is retrieved as
        sent (no rewriter), the Retriever ranks the query once and the Detector decides from its
        answer; that halves the encoder work per request (a MiniLM query costs 12-20 ms a pass on
        one core, benchmarks/results/encoder_runtime.md). Otherwise (a pinned detector of another
        artifact, a ranking whose top score depends on k) the detector runs first and a query that
        needs no tool is never ranked. A swap landing between the two calls is safe: the Detector
        decides from an answer only under its own ranking key. A Retriever that fails here does not
        fail a query that needs no tool: the Detector then decides alone, as in the other order.
        """
        found = None
        if self.share_ranking and same_ranking(self.reads_ranking_of, self.retrieved_with):
            try:
                ranked = self._call(self.retriever.retrieve, (req.query, req.top_k))
                found = await self._timed(timings, "retrieve", ranked)
            except Exception as e:  # a query that needs no tool is still answered without it
                logger.warning("retriever failed before detection, detecting alone: %s", e)
                # Detect first again until a retrieval succeeds: while the Retriever is down, a
                # query that needs no tool must not wait out its retries.
                self.retrieved_with = None
        if found is None:
            return await self._detect_alone(req.query, timings), None
        # A replica that does not say what it ranked with (an older one, mid-rollout) sends no
        # ranking key: the Detector then encodes the query itself.
        self.retrieved_with = found.get("ranking")
        answer = (req.query, found.get("top_score", 0.0), found.get("detected"), self.retrieved_with)
        try:
            detected = await self._timed(timings, "detect", self._call(self.detector.detect_scored, *answer))
        except BackendUnavailable:
            raise
        except Exception as e:  # e.g. an older Detector replica without detect_scored, mid-rollout
            logger.warning("detection from the retriever's ranking failed, detecting alone: %s", e)
            return await self._detect_alone(req.query, timings), found
        self.reads_ranking_of = detected.get("reads_ranking_of")
        return detected, found

    async def _detect_alone(self, query: str, timings: dict[str, float]) -> dict[str, Any]:
        detected = await self._timed(timings, "detect", self._call(self.detector.detect, query))
        self.reads_ranking_of = detected.get("reads_ranking_of")
        return detected

    async def _select(self, req: SelectRequest, timings: dict[str, float]) -> dict[str, Any]:
        detected, found = await self._detect_and_retrieve(req, timings)
        threshold = next(
            t for t in (req.needs_tool_threshold, self.threshold, detected["threshold"]) if t is not None
        )
        out: dict[str, Any] = {
            "needs_tool": detected["probability"] >= threshold,
            "probability": detected["probability"],
            "tools": [],
            "call": None,
            "versions": {"detector": detected["version"], "retriever": None},
        }
        if not out["needs_tool"]:
            return out
        text = req.query
        if self.rewriter is not None:
            try:
                text = await self._timed(
                    timings, "rewrite", self._call(self.rewriter.rewrite, req.query, req.history)
                )
            except Exception as e:  # retrieval on the request's own words is still an answer
                logger.warning("rewriter failed, retrieving with the query as sent: %s", e)
        if found is None:
            ranked = self._call(self.retriever.retrieve, (text, req.top_k))
            found = await self._timed(timings, "retrieve", ranked)
            self.retrieved_with = found.get("ranking")
        out["tools"] = found["tools"]
        out["versions"]["retriever"] = found["version"]
        if self.selector is not None and found["tools"]:
            ask = {
                "query": req.query,
                "history": req.history,
                "candidates": [t["id"] for t in found["tools"]],
            }
            try:
                out["call"] = await self._timed(timings, "select", self._call(self.selector.select, ask))
            except Exception as e:  # the ranking is still an answer when the LLM is down
                logger.warning("selector failed, answering with the ranking only: %s", e)
        return out

    async def answer(self, body: SelectRequest) -> dict[str, Any]:
        """The answer to one request, for both doors (HTTP ``/v1/select`` and MCP ``find_tools``)."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        out = await self._select(body, timings)
        timings["total"] = round((time.perf_counter() - start) * 1000, 3)
        # The retriever's version, or the detector's when no tool was needed.
        model_version = out["versions"]["retriever"] or out["versions"]["detector"]
        return {**out, "model_version": model_version, "timings_ms": timings}

    async def _mcp_select(self, body: SelectRequest) -> dict[str, Any]:
        return await _for_mcp(self.answer(body))

    async def _describe(self, tool_ids: list[str]) -> list[dict[str, Any] | None]:
        return await _for_mcp(self._call(self.retriever.describe, tool_ids))

    async def _lookup(self, key: str) -> list[dict[str, Any]]:
        return await _for_mcp(self._call(self.retriever.lookup, key))

    @api.post(
        "/v1/select", response_model=SelectResponse, responses=ERRORS, dependencies=[Depends(require_json)]
    )
    async def select(self, body: SelectRequest) -> Any:
        """Does the request need a tool; if so, the top-k tools and the selected call."""
        try:
            return await self.answer(body)
        except BackendUnavailable as e:
            return error(503, "backend_unavailable", str(e))

    @api.get("/v1/tools", response_model=ToolsInfo, responses={c: ERRORS[c] for c in (401, 500, 503)})
    async def tools(self) -> Any:
        """Catalog size, and the retriever's model and catalog versions."""
        try:
            return await self._call(self.retriever.info)
        except BackendUnavailable as e:
            return error(503, "backend_unavailable", str(e))

    @api.get("/healthz", response_model=Health)
    async def healthz(self) -> Any:
        """Liveness of the ingress (Serve health-checks the model replicas itself)."""
        return {"status": "ok"}


IngressDeployment = serve.ingress(api)(Ingress)
