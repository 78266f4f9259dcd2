"""The engines a generative method's constrained decoder can run on (kept free of torch imports, so
that the Serve app checks a setting without loading an LM library)."""

from __future__ import annotations

from typing import Any

from components.generative.chat_endpoint import ChatEndpoint

# transformers: the PyTorch LM (CPU or GPU); llama.cpp: a GGUF export of it (CPU serving); vllm: the
# same LM served by vLLM (Ray Serve LLM on a GPU cluster, or vLLM's CPU build), reached over HTTP.
ENGINES = ("transformers", "llama.cpp", "vllm")


def check_engine(engine: str, owner: str) -> str:
    """``engine`` if known; otherwise a ValueError naming ``owner`` and the engines there are."""
    if engine not in ENGINES:
        raise ValueError(f"{owner}: engine must be one of {list(ENGINES)}, got {engine!r}")
    return engine


def check_engine_endpoint(
    engine: str | None,
    endpoint: dict[str, Any] | None,
    owner: str = "",
    engine_key: str = "engine",
    endpoint_key: str = "engine_endpoint",
) -> None:
    """An engine behind a server (``vllm``) needs its endpoint section, which is checked as every
    endpoint is (:meth:`ChatEndpoint.from_config`); ``owner`` and the keys name the settings in errors."""
    prefix = f"{owner}: " if owner else ""
    if engine == "vllm" and not endpoint:
        raise ValueError(
            f"{prefix}{engine_key} vllm needs {endpoint_key} ({{endpoint: .../v1, model: <served name>}})"
        )
    if endpoint:
        ChatEndpoint.from_config(endpoint, f"{owner}.{endpoint_key}" if owner else endpoint_key)
