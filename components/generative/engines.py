"""The engines a generative method's constrained decoder can run on (kept free of torch imports, so
that the Serve app checks a setting without loading an LM library)."""

from __future__ import annotations

# transformers: the PyTorch LM (CPU or GPU); llama.cpp: a GGUF export of it (CPU serving); vllm: the
# same LM served by vLLM (Ray Serve LLM on a GPU cluster, or vLLM's CPU build), reached over HTTP.
ENGINES = ("transformers", "llama.cpp", "vllm")


def check_engine(engine: str, owner: str) -> str:
    """``engine`` if known; otherwise a ValueError naming ``owner`` and the engines there are."""
    if engine not in ENGINES:
        raise ValueError(f"{owner}: engine must be one of {list(ENGINES)}, got {engine!r}")
    return engine
