"""The query-rewriting slot: what the retriever searches with, given the request and its history.

Backends (``rewriter.backend`` in the serving config):

- ``passthrough``: the query as sent (the slot exists but is not deployed);
- ``history``: the last ``turns`` history turns prepended, so a follow-up such as "and in Rome?"
  is retrieved with its context (the conversational query rewriting baseline of concatenating
  context, Vakulenko et al., 2021);
- ``lm``: a causal LM (hub name or local dir, :func:`components.generative.lm.load_causal_lm`)
  generates the rewrite greedily from ``prompt``; the query generation method plugs in here.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from components.generative.lm import load_causal_lm


class Rewriter(Protocol):
    """Turns (query, history) into the text the retriever searches with."""

    def rewrite(self, query: str, history: list[str]) -> str: ...


class PassThrough:
    """The query unchanged."""

    def rewrite(self, query: str, history: list[str]) -> str:
        return query


class HistoryRewriter:
    """The last ``turns`` turns of history, then the query, as one search text."""

    def __init__(self, turns: int = 2) -> None:
        if turns < 0:
            raise ValueError(f"rewriter.turns must be >= 0, got {turns}")
        self.turns = turns

    def rewrite(self, query: str, history: list[str]) -> str:
        context = history[-self.turns :] if self.turns else []
        return " ".join([*context, query])


class LMRewriter:
    """Greedy generation from a causal LM; an empty generation falls back to the query."""

    def __init__(
        self,
        model: str,
        prompt: str = "{history}\nrequest: {query}\nrewrite:",
        max_new_tokens: int = 32,
        turns: int = 2,
    ) -> None:
        self.model, self.tokenizer = load_causal_lm(model)
        self.model.eval()
        self.prompt, self.max_new_tokens, self.turns = prompt, max_new_tokens, turns

    @torch.inference_mode()
    def rewrite(self, query: str, history: list[str]) -> str:
        context = " ".join(history[-self.turns :]) if self.turns else ""
        enc = self.tokenizer(self.prompt.format(history=context, query=query), return_tensors="pt")
        out = self.model.generate(
            **enc,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        text = self.tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        text = text.split("\n")[0].strip()
        return text or query


def build_rewriter(cfg: dict[str, Any] | None) -> Rewriter:
    """A rewriter from the ``rewriter`` config section (``backend`` plus its settings)."""
    cfg = dict(cfg or {})
    backend = cfg.pop("backend", "passthrough")
    if backend == "passthrough":
        return PassThrough()
    if backend == "history":
        return HistoryRewriter(**cfg)
    if backend == "lm":
        return LMRewriter(**cfg)
    raise ValueError(f"unknown rewriter backend {backend!r}; choose passthrough, history or lm")
