"""The application builder: ``serve run deploy/serve_config.yaml`` imports :func:`build_app`.

The graph is Ingress → Detector → [QueryRewriter] → Retriever → [Selector]. Model settings reach
the deployments as user configs, built here from ``args``; replica settings (autoscaling, CPUs)
come from the ``deployments`` list, in the same format as a Serve config file's, whose entries
``serve run`` / ``serve deploy`` apply on top. Serve hashes ``args`` into the app's code version,
so a hot-swap changes a deployment's ``user_config`` in the config file instead (see
:func:`components.serving.swap.swap_artifact`): replicas then reconfigure in place.

Artifacts are checked and pinned where the user configs are built (in Serve's build task, or on
the driver for a swap), not in the replicas: a registry URI such as ``models:/<name>@champion``
becomes the local directory of the version it names. Replicas started later (autoscaling, a crash
replacement) get the same user config, so they load the same version as their peers even after a
promotion. Redeploying an unchanged config does not rebuild the app; to follow a moved alias,
swap to the URI again (:func:`~components.serving.swap.follow_model` pins what it names then).
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from ray import serve
from ray.serve import Application

from components.encoders.runtimes import check_runtime
from components.generative.engines import check_engine, check_engine_endpoint
from components.methods import artifact_method
from components.registry import RegistrySettings, resolve_version
from components.serving import catalog as tool_catalog
from components.serving.batch_calls import BatchedDeployment, BatchOptions
from components.serving.deployments import DEFAULT_CACHE_SIZE, Detector, QueryRewriter, Selector
from components.serving.errors import API_KEY_ENV
from components.serving.ingress import IngressDeployment
from components.serving.models import DEFAULT_ENCODER_RUNTIME
from components.serving.retriever_deployment import Retriever
from components.serving.selector import check_deadline

FALLBACK_ACTOR_OPTIONS = {"num_cpus": 0.25}  # for no resources named: 4 of 1 CPU do not fit 2 cores
# Used when the config names no cap. Serve's default (5) makes a busy stage reject, and its router
# then retries with growing backoff while the replica idles: a Selector at 5 served 8 req/s to 32
# clients (99 at a cap of 32), and at 32 it served 12 to 64 clients (117 at 128). Queued requests
# still count toward autoscaling.
FALLBACK_MAX_ONGOING_REQUESTS = 128
# Used when the config names none. A replica being stopped (a rolling update, a scale-down, an app
# deleted) checks for in-flight requests every this many seconds before it exits; Serve's 2 s made
# every redeploy and delete wait ~2 s after the last request drained (measured: delete 3.0 s at
# 2 s, 1.0 s at 0.1 s). The check is a counter read, so polling faster costs nothing.
FALLBACK_SHUTDOWN_WAIT_LOOP_S = 0.1


class ServeArgs(BaseModel):
    """``args`` of the application (``applications[].args`` in a Serve config file)."""

    model_config = ConfigDict(extra="forbid")

    artifact: str = Field(
        description="Retriever artifact: a dir, or a registry URI such as models:/<name>@champion "
        "(pinned to the version it names when the app is built)."
    )
    catalog: str = Field(description="Dataset dir (raw or prepared) whose corpus names the tools.")
    detector_artifact: str | None = Field(None, description="Detector artifact; default: artifact.")
    detector_file: str | None = Field(
        None, description="Threshold calibrations JSON (methods without detect)."
    )
    calibration_data: str | None = Field(
        None, description="Dataset to calibrate on when the file has no entry."
    )
    splits: dict[str, Any] | None = Field(None, description="The splits config used in training (for valid).")
    rewriter: dict[str, Any] = Field(default_factory=lambda: {"backend": "passthrough"})
    selector: dict[str, Any] = Field(default_factory=lambda: {"backend": "none"})
    batching: dict[BatchedDeployment, BatchOptions] = Field(
        default_factory=dict, description="Per deployment: max_batch_size, batch_wait_timeout_s."
    )
    cache_size: int = Field(
        DEFAULT_CACHE_SIZE,
        ge=0,
        description="Answers each Detector / Retriever replica keeps for repeated queries (LRU keyed "
        "by model version and normalised query, emptied on a hot-swap); 0: no cache.",
    )
    encoder_runtime: str = Field(
        DEFAULT_ENCODER_RUNTIME,
        description="Where the Detector's and Retriever's text encoders (dense, MassTool) run: auto "
        "(OpenVINO bf16 on a CPU with native bf16, else ONNX Runtime fp32; PyTorch on a GPU), torch, "
        "onnx, onnx-int8, openvino or openvino-bf16 (BM25 has none to move).",
    )
    lm_engine: str | None = Field(
        None,
        description="Where a ToolGen / ToolWeaver artifact's constrained decoder runs: transformers "
        "(PyTorch), llama.cpp (a GGUF export of the trained LM, CPU) or vllm (the trained LM served by "
        "vLLM, at lm_endpoint); null: as it was saved.",
    )
    lm_endpoint: dict[str, Any] | None = Field(
        None,
        description="For lm_engine vllm: {endpoint: http://host:8000/v1, model: <served name>} of the "
        "server that holds the artifact's LM (<artifact>/lm), e.g. the LLM app "
        "(deploy/serve_config_llm.yaml).",
    )
    needs_tool_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Default decision threshold; null: the detector's own (a MassTool artifact's "
        "detect_threshold; for a calibrated score threshold, the probability at its chosen cut-off).",
    )
    share_ranking: bool = Field(
        True,
        description="A detector of the retriever's own artifact decides from the retriever's answer "
        "(its top score; MassTool's detection from the same pass) instead of encoding the query again "
        "(no rewriter); false: encode twice.",
    )
    api_key: str | None = Field(None, description=f"Sets ${API_KEY_ENV} in the ingress replicas.")
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Web origins (e.g. https://console.example.com) whose pages may call the app "
        "besides loopback ones; any other Origin is refused (DNS rebinding).",
    )
    deployments: list[dict[str, Any]] = Field(default_factory=list, description="Serve deployment options.")
    registry: dict[str, Any] | None = Field(
        None,
        description="Where models:/ URIs resolve (tracking_uri, root); null: $MLFLOW_TRACKING_URI, "
        "else the embedded store under runs/registry.",
    )

    @field_validator("encoder_runtime")
    @classmethod
    def _known_runtime(cls, runtime: str) -> str:
        return check_runtime(runtime)

    @field_validator("lm_engine")
    @classmethod
    def _known_engine(cls, engine: str | None) -> str | None:
        return engine if engine is None else check_engine(engine, "lm_engine")

    @model_validator(mode="after")
    def _consistent(self) -> ServeArgs:
        check_deadline(self.selector)
        check_engine_endpoint(
            self.lm_engine, self.lm_endpoint, engine_key="lm_engine", endpoint_key="lm_endpoint"
        )
        if self.lm_endpoint and self.lm_engine != "vllm":
            raise ValueError("lm_endpoint is the server of lm_engine vllm; set lm_engine: vllm")
        return self


def _local(path: str | None) -> str | None:
    """Absolute local paths (replicas need not share the builder's working directory); URLs as is."""
    return path if path is None or "://" in path else os.path.abspath(path)


# The keys of the optional sections that name a local file or dir (a selector LM, a .gguf, a
# query-generation artifact): made absolute wherever the args are (replicas' cwd differs).
SECTION_FILES = {"selector": ("model",), "rewriter": ("model", "path")}
# The deployments whose user config :func:`user_configs` builds from the args (what a swap changes).
USER_CONFIG_DEPLOYMENTS = ("Detector", "Retriever", "QueryRewriter", "Selector")


def local_files(section: dict[str, Any], keys: tuple[str, ...], base: str = "") -> dict[str, Any]:
    """``section`` with those of its ``keys`` that name an existing local file or dir (relative to
    ``base``, default this process's working directory) made absolute (a hub name or URL is left)."""
    section = dict(section)
    for key in keys:
        if isinstance(section.get(key), str) and os.path.exists(os.path.join(base, section[key])):
            section[key] = os.path.abspath(os.path.join(base, section[key]))
    return section


def pinned(path: str, registry: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"artifact": <absolute dir of one version>}``, checked to hold a known method, plus, for a
    registry URI, ``source`` (the immutable ``models:/<name>/<N>`` of that version) and
    ``registry`` (how to reach the registry from any process).

    A registry URI (``models:/<name>@champion``) is resolved here, once, to the version it names now
    (``.../versions/<name>/v<N>`` on this machine): every replica then loads that version, even one
    started after the alias moves. Following the alias is a swap (see
    :func:`components.serving.swap.follow_model`). The directory exists where it was resolved;
    a replica on another node of the cluster, where it was never materialised, materialises the
    same version from ``source`` (:func:`components.serving.models.artifact_dir`).

    Raises:
        ValueError: ``path`` is no directory, has no readable ``config.json``, names a method that
            is not registered, or is a URI the registry cannot resolve; said here, before any
            replica tries to load it.
    """
    try:
        local, found = resolve_version(path, registry)
    except LookupError as e:
        raise ValueError(f"artifact {path!r}: {e}") from e
    version = os.path.abspath(local)
    extra: dict[str, Any] = {}
    if found is not None:
        settings = RegistrySettings.from_config(registry).as_config()
        extra = {"source": f"models:/{found.name}/{found.number}", "registry": settings}
    if not os.path.isdir(version):
        raise ValueError(f"artifact {path!r}: {version} is not a directory")
    try:
        artifact_method(version)
    except (OSError, ValueError) as e:  # missing, unreadable, or not JSON
        raise ValueError(f"artifact {path!r}: cannot read its config.json: {e}") from e
    except KeyError as e:
        raise ValueError(f"artifact {path!r}: {e.args[0]}") from e
    return {"artifact": version, **extra}


def deployment_options(args: ServeArgs, name: str) -> dict[str, Any]:
    """Serve options of deployment ``name``: its ``args.deployments`` entry over the fallbacks."""
    options = next((dict(d) for d in args.deployments if d.get("name") == name), {})
    options.pop("name", None)
    options.setdefault("ray_actor_options", dict(FALLBACK_ACTOR_OPTIONS))
    options.setdefault("max_ongoing_requests", FALLBACK_MAX_ONGOING_REQUESTS)
    options.setdefault("graceful_shutdown_wait_loop_s", FALLBACK_SHUTDOWN_WAIT_LOOP_S)
    return options


def _deployment(cls: type, name: str, args: ServeArgs, user_config: dict[str, Any] | None = None) -> Any:
    options = deployment_options(args, name)
    if user_config is not None:
        options["user_config"] = user_config
    return serve.deployment(cls, name=name).options(**options)


def catalog_version(catalog: str) -> str:
    """The content hash of the catalog's corpus, read here on the driver.

    Raises:
        ValueError: the catalog cannot be read (said here, before any replica tries).
    """
    try:
        return tool_catalog.catalog_version(catalog)
    except OSError as e:
        raise ValueError(f"catalog {catalog!r}: cannot read its corpus: {e}") from e


def user_configs(args: ServeArgs) -> dict[str, dict[str, Any]]:
    """The user config of each model deployment (what a hot-swap changes), batching included.

    Artifacts are pinned (see :func:`pinned`), so every replica loads the same version.
    """
    retriever = pinned(args.artifact, args.registry)
    rewrites = (args.rewriter or {}).get("backend") == "querygen"
    if rewrites and artifact_method(retriever["artifact"])[1] == "querygen":
        # A query-generation artifact rewrites each query itself (with the fusion chosen on valid):
        # a querygen rewriter in front of it would rewrite the rewrite.
        raise ValueError(
            f"artifact {args.artifact!r} is a querygen method, which rewrites queries itself: serve it "
            "without rewriter.backend=querygen, or serve its retriever/ with the querygen rewriter"
        )
    detector = {
        **(pinned(args.detector_artifact, args.registry) if args.detector_artifact else retriever),
        "detector_file": _local(args.detector_file),
        "calibration_data": _local(args.calibration_data),
        "splits": args.splits,
        "cache_size": args.cache_size,
        "encoder_runtime": args.encoder_runtime,
        # A generative artifact's threshold detector decodes as its retriever does, on the same engine.
        "lm_engine": args.lm_engine,
        "lm_endpoint": args.lm_endpoint,
    }
    # Local model files (a selector LM dir, a .gguf, a query-generation artifact) as absolute paths.
    selector = local_files(args.selector, SECTION_FILES["selector"])
    rewriter = local_files(args.rewriter, SECTION_FILES["rewriter"])
    version = catalog_version(_local(args.catalog))
    configs = {
        "Detector": detector,
        # The corpus's content hash: when `toolscout ingest mcp` changes it, rebuilding these
        # configs (swap.refresh_catalog) makes the Retriever replicas read the catalog again.
        "Retriever": {
            **retriever,
            "cache_size": args.cache_size,
            "encoder_runtime": args.encoder_runtime,
            "lm_engine": args.lm_engine,
            "lm_endpoint": args.lm_endpoint,
            "catalog_version": version,
        },
        "QueryRewriter": rewriter,
        # Its candidates' schemas come from the same catalog: it reloads when the Retriever does.
        "Selector": {**selector, "catalog_version": version},
    }
    return {name: {**config, **args.batching.get(name, {})} for name, config in configs.items()}


def build_app(args: dict[str, Any]) -> Application:
    """The bound graph, ready for ``serve.run`` (or built by ``serve run`` from a config file)."""
    a = ServeArgs.model_validate(args)
    configs = user_configs(a)
    catalog = _local(a.catalog)
    detector = _deployment(Detector, "Detector", a, configs["Detector"]).bind()
    retriever = _deployment(Retriever, "Retriever", a, configs["Retriever"]).bind(catalog)
    rewriter = None
    if a.rewriter.get("backend", "passthrough") != "passthrough":
        rewriter = _deployment(QueryRewriter, "QueryRewriter", a, configs["QueryRewriter"]).bind()
    selector = None
    if a.selector.get("backend", "none") != "none":
        selector = _deployment(Selector, "Selector", a, configs["Selector"]).bind(catalog)
    # The API key travels as a constructor argument: a config file's ray_actor_options for the
    # Ingress replace the ones set here wholesale, so an env var put there could be dropped.
    ingress = serve.deployment(IngressDeployment, name="Ingress").options(**deployment_options(a, "Ingress"))
    options = {"api_key": a.api_key, "share_ranking": a.share_ranking, "allowed_origins": a.allowed_origins}
    return ingress.bind(detector, retriever, rewriter, selector, a.needs_tool_threshold, **options)
