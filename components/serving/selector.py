"""The selector slot: which backend picks the call among the retrieved candidates.

``selector.backend`` in the serving config:

- ``none``: no LLM; the response carries the ranking and no call;
- ``lm``: a local causal LM with constrained decoding (:mod:`.selector_lm`), ``model`` = hub name
  or a dir written by :func:`components.serving.selector_train.train_selector_lm`;
- ``openai``: an OpenAI-compatible endpoint (:mod:`.selector_http`), ``url`` + ``model``;
- ``llamacpp``: a GGUF model under llama.cpp on CPU, decoding bound to a grammar of the candidates'
  calls (:mod:`.selector_llamacpp`), ``model`` = ``smollm2-135m`` or a ``.gguf`` path.
"""

from __future__ import annotations

from typing import Any, Protocol

from components.config import is_number
from components.serving.catalog import ToolCatalog

# A call not chosen by then is answered as none (the Selector deployment's ``deadline_s``).
DEFAULT_SELECT_DEADLINE_S = 30.0


def check_deadline(cfg: dict[str, Any]) -> None:
    """Refuse a backend ``timeout_s`` past the deployment's ``deadline_s``: the deployment stops
    waiting at the deadline, so calls the timeout was raised for would be answered as none.

    Raises:
        ValueError: ``timeout_s`` > ``deadline_s``.
    """
    deadline, timeout = cfg.get("deadline_s", DEFAULT_SELECT_DEADLINE_S), cfg.get("timeout_s")
    if is_number(deadline) and is_number(timeout) and timeout > deadline:
        raise ValueError(
            f"selector.timeout_s {timeout} is past selector.deadline_s {deadline}: the Selector stops "
            f"waiting at the deadline, so set deadline_s >= timeout_s"
        )


class Selector(Protocol):
    # Whether a batch's calls may run at once (they wait on a network endpoint, not on local cores).
    concurrent_calls: bool

    def select(self, query: str, history: list[str], candidates: list[str]) -> dict[str, Any] | None: ...


def build_selector(cfg: dict[str, Any] | None, catalog: ToolCatalog) -> Selector | None:
    """The configured selector, or ``None`` for ``backend: none``."""
    cfg = dict(cfg or {})
    backend = cfg.pop("backend", "none")
    if backend == "none":
        return None
    if backend == "lm":
        from components.serving.selector_lm import LMSelector

        return LMSelector(catalog=catalog, **cfg)
    if backend == "openai":
        from components.serving.selector_http import OpenAISelector

        return OpenAISelector(catalog=catalog, **cfg)
    if backend == "llamacpp":
        from components.serving.selector_llamacpp import LlamaCppSelector

        return LlamaCppSelector(catalog=catalog, **cfg)
    raise ValueError(f"unknown selector backend {backend!r}; choose none, lm, openai or llamacpp")
