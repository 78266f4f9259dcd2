"""The query-rewriting slot: what the retriever searches with, given the request and its history.

Backends (``rewriter.backend`` in the serving config):

- ``passthrough``: the query as sent (the slot exists but is not deployed);
- ``history``: the last ``turns`` history turns prepended, so a follow-up such as "and in Rome?"
  is retrieved with its context (the conversational query rewriting baseline of concatenating
  context, Vakulenko et al., 2021);
- ``lm``: a causal LM (hub name or local dir, :func:`components.generative.lm.load_causal_lm`)
  generates the rewrite greedily from ``prompt``;
- ``querygen``: the generator of a trained query-generation artifact (``path``; arXiv 2412.03573,
  :mod:`components.methods.querygen`), prompted as it was trained; for a zero-shot artifact whose
  generator is an OpenAI-compatible endpoint or a llama.cpp GGUF, that engine. Only the rewrite
  text comes out: the retriever still answers with catalog ids, so a generated name can never
  reach the caller.

Every backend rewrites a batch at once (``rewrite_many``): the serving deployment batches concurrent
requests through it. The LM backends import their generation code when built: every serving
replica imports this module, and transformers' model classes cost seconds of start-up that a
replica without an LM rewriter should not pay.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

from components.methods.base import read_config

Request = tuple[str, list[str]]  # (query, history)
log = logging.getLogger(__name__)


class Rewriter(Protocol):
    """Turns (query, history) into the text the retriever searches with."""

    def rewrite(self, query: str, history: list[str]) -> str: ...

    def rewrite_many(self, requests: list[Request]) -> list[str]: ...


class PassThrough:
    """The query unchanged."""

    def rewrite(self, query: str, history: list[str]) -> str:
        return query

    def rewrite_many(self, requests: list[Request]) -> list[str]:
        return [q for q, _ in requests]


class HistoryRewriter:
    """The last ``turns`` turns of history, then the query, as one search text."""

    def __init__(self, turns: int = 2) -> None:
        if turns < 0:
            raise ValueError(f"rewriter.turns must be >= 0, got {turns}")
        self.turns = turns

    def rewrite(self, query: str, history: list[str]) -> str:
        context = history[-self.turns :] if self.turns else []
        return " ".join([*context, query])

    def rewrite_many(self, requests: list[Request]) -> list[str]:
        return [self.rewrite(q, h) for q, h in requests]


class LMRewriter:
    """Greedy generation from a causal LM; an empty generation falls back to the query."""

    def __init__(
        self,
        model: str,
        prompt: str = "{history}\nrequest: {query}\nrewrite:",
        max_new_tokens: int = 32,
        turns: int = 2,
    ) -> None:
        from components.generative.lm import load_causal_lm

        self.model, self.tokenizer = load_causal_lm(model)
        self.model.eval()
        self.prompt, self.max_new_tokens, self.turns = prompt, max_new_tokens, turns

    def rewrite(self, query: str, history: list[str]) -> str:
        return self.rewrite_many([(query, history)])[0]

    def rewrite_many(self, requests: list[Request]) -> list[str]:
        prompts = []
        for query, history in requests:
            context = " ".join(history[-self.turns :]) if self.turns else ""
            prompts.append(self.prompt.format(history=context, query=query))
        from components.generative.generate import generate_texts

        texts = generate_texts(self.model, self.tokenizer, prompts, self.max_new_tokens)
        return [t[0] or q for t, (q, _) in zip(texts, requests, strict=True)]


class QueryGenRewriter:
    """The generator of a query-generation artifact, with the system prompt it was trained under
    (its LM, or the OpenAI-compatible endpoint its params name); the last ``turns`` of history are
    prepended to the request, as :class:`HistoryRewriter` does.

    ``endpoint`` (:class:`components.generative.chat_endpoint.ChatEndpoint` keys) has an LLM server
    generate instead of this replica, prompted and capped as the artifact says: e.g. Ray Serve LLM
    with the artifact's generator as a LoRA adapter (``model: smollm2:<adapter>``, exported by
    :func:`components.methods.querygen.adapter.export_generator_adapter`)."""

    def __init__(
        self, path: str, turns: int = 0, batch_size: int = 8, endpoint: dict[str, Any] | None = None
    ) -> None:
        # The method's own generator, prompted by the artifact's params, batched as serving asks.
        from components.methods.querygen.generator import make_generator
        from components.methods.querygen.params import QueryGenParams

        config = read_config(path)
        if config.get("method") != "querygen":
            raise ValueError(
                f"rewriter.path {path}: a {config.get('method')!r} artifact; the querygen rewriter "
                "takes one trained with method querygen"
            )
        if config.get("fusion") == "rrf":
            # The artifact retrieves best fusing the original and the rewritten query (chosen on
            # valid); in front of a Retriever, the rewrite alone is searched.
            log.warning(
                "rewriter.path %s chose fusion 'rrf' on valid; as a rewriter only its rewrite is "
                "searched ('generated'): serve the artifact itself as the retriever to fuse",
                path,
            )
        saved = {**config["params"], "eval_batch_size": batch_size}
        if endpoint is not None:  # the server holds the trained weights: nothing trains here
            saved |= {"generator": dict(endpoint), "sft": {"epochs": 0}, "align": {"rounds": 0}}
        params = QueryGenParams(**saved)
        self.generator = make_generator(params, os.path.join(path, "generator"))
        self.generator.ready()
        self.history = HistoryRewriter(turns)

    def rewrite(self, query: str, history: list[str]) -> str:
        return self.rewrite_many([(query, history)])[0]

    def rewrite_many(self, requests: list[Request]) -> list[str]:
        return self.generator.rewrite([self.history.rewrite(q, h) for q, h in requests])


# Keys of a ``rewriter`` section that configure its Serve deployment (the fallback timeout and the
# rewrite cache, see :class:`components.serving.deployments.QueryRewriter`), not the rewriter.
DEPLOYMENT_KEYS = ("timeout_s", "cache_size")


def rewriter_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rewriter's own settings in a ``rewriter`` section: without :data:`DEPLOYMENT_KEYS`."""
    return {k: v for k, v in cfg.items() if k not in DEPLOYMENT_KEYS}


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
    if backend == "querygen":
        return QueryGenRewriter(**cfg)
    raise ValueError(f"unknown rewriter backend {backend!r}; choose passthrough, history, lm or querygen")
