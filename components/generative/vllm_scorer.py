"""Next-token log-probabilities from a vLLM server, for the trie-constrained decoder.

ToolGen's and ToolWeaver's retrieval (:mod:`components.generative.constrained`) needs, after each
prompt + code prefix, the log-probability of every token that may come next under the LM's *full*
softmax: the beam scores of ``generate`` with a ``prefix_allowed_tokens_fn``. vLLM returns exactly
that for named tokens: a ``/v1/completions`` request with ``logprob_token_ids`` (vLLM >= 0.12; the
default ``logprobs_mode`` is ``raw_logprobs``, i.e. before any logits processor) and ``max_tokens: 1``
answers with the log-probability of each named token after the prompt. The prompt goes as token ids
from the method's own tokenizer, so the served LM must be the method's trained LM with its tool
tokens (its ``lm/`` directory; ``vllm serve <artifact>/lm`` or the Ray Serve LLM app with ``model:
<artifact>/lm``). Renormalising over the allowed tokens instead (vLLM's ``allowed_token_ids`` with
processed log-probabilities) would rank multi-token codes differently from the other engines.

vLLM caps a request at 128 named tokens (``MAX_LOGPROB_TOKEN_IDS``) and the engine's ``max_logprobs``
(default 20) must be at least as many: the LLM app sets it to 128. A step that allows more tokens
(ToolGen's first step allows every tool) is split into requests of 128 for the same prompt. Prompts
that name the same tokens share a request (ToolGen's first step for a batch of queries: a few requests,
not a few per query), and requests run concurrently, so the engine batches them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from components.generative.chat_endpoint import ChatEndpoint, ChatEndpointError, post_chat_completion

MAX_TOKEN_IDS = 128  # vLLM's MAX_LOGPROB_TOKEN_IDS: named tokens per request
TOKEN_KEY = "token_id:"  # how vLLM names a token with return_tokens_as_token_ids


@dataclass
class VLLMScorer:
    """A :class:`components.generative.targeted.NextTokenScorer` over a vLLM completions endpoint.

    Attributes:
        server: Where the method's trained LM is served (``endpoint`` with ``/v1``, ``model`` its
            served name, an optional ``api_key_env``, ``timeout_s`` and ``concurrency``).
        max_token_ids: Tokens named per request (at most vLLM's cap, 128).
        prompts_per_request: Sequences that name the same tokens go in one request, this many at most.
    """

    server: ChatEndpoint
    max_token_ids: int = MAX_TOKEN_IDS
    prompts_per_request: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.max_token_ids <= MAX_TOKEN_IDS:
            raise ValueError(f"max_token_ids must be 1 to {MAX_TOKEN_IDS}, got {self.max_token_ids}")
        if self.prompts_per_request < 1:
            raise ValueError(f"prompts_per_request must be >= 1, got {self.prompts_per_request}")

    @classmethod
    def from_config(cls, cfg: dict[str, Any], owner: str, **options: int) -> VLLMScorer:
        """From an endpoint section (``{"endpoint": url, "model": name, ...}``), checked as the
        rewriter's endpoint is; ``owner`` names it in errors; ``options``: the other attributes."""
        return cls(ChatEndpoint.from_config(cfg, owner), **options)

    @property
    def url(self) -> str:
        return self.server.endpoint.rstrip("/") + "/completions"

    def _logprobs(self, sequences: list[list[int]], ids: list[int]) -> list[dict[int, float]]:
        """The log-probabilities of ``ids`` after each of ``sequences`` (one request, one prompt each)."""
        body = {
            "model": self.server.model,
            "prompt": sequences,
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": len(ids),  # vLLM wants it equal to the number of named tokens
            "logprob_token_ids": ids,
            "return_tokens_as_token_ids": True,
        }
        key = os.environ.get(self.server.api_key_env) if self.server.api_key_env else None
        answer = post_chat_completion(self.url, body, key, self.server.timeout_s)
        try:
            choices = sorted(answer["choices"], key=lambda c: c["index"])
            named = [c["logprobs"]["top_logprobs"][0] for c in choices]
            got = [{int(k.removeprefix(TOKEN_KEY)): float(v) for k, v in n.items()} for n in named]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ChatEndpointError(f"{self.url}: not a completion with logprobs: {str(answer)[:200]}") from e
        if len(got) != len(sequences):
            raise ChatEndpointError(f"{self.url}: {len(got)} choices for {len(sequences)} prompts")
        for named in got:
            missing = sorted(set(ids) - set(named))
            if missing:  # a server without logprob_token_ids answers with its top tokens only
                raise ChatEndpointError(
                    f"{self.url}: no log-probability for tokens {missing[:5]}: the server must be vLLM "
                    f"with logprob_token_ids (>= 0.12) and max_logprobs >= {MAX_TOKEN_IDS}"
                )
        return got

    def next_logprobs(
        self, sequences: Sequence[Sequence[int]], wanted: Sequence[Sequence[int]] | None = None
    ) -> torch.Tensor:
        """``(len(sequences), width)`` log-probabilities of the token after each sequence: those in
        ``wanted[i]`` filled in, every other entry ``-inf`` (the server is asked for no others)."""
        if wanted is None or len(wanted) != len(sequences):
            raise ValueError("the vLLM scorer needs, per sequence, the token ids it may continue with")
        # Sequences asking for the same tokens share requests (ToolGen's first step: every query
        # asks for every tool), up to ``prompts_per_request`` prompts each.
        groups: dict[tuple[int, ...], list[int]] = {}
        for row, ids in enumerate(wanted):
            ids = sorted({int(t) for t in ids})
            for start in range(0, len(ids), self.max_token_ids):
                groups.setdefault(tuple(ids[start : start + self.max_token_ids]), []).append(row)
        jobs = [
            (rows[i : i + self.prompts_per_request], list(ids))
            for ids, rows in groups.items()
            for i in range(0, len(rows), self.prompts_per_request)
        ]
        width = 1 + max((max(ids) for _, ids in jobs), default=0)
        out = torch.full((len(sequences), width), float("-inf"))

        prompts = [[int(t) for t in seq] for seq in sequences]  # JSON wants plain ints

        def ask(job: tuple[list[int], list[int]]) -> list[dict[int, float]]:
            rows, ids = job
            return self._logprobs([prompts[r] for r in rows], ids)

        with ThreadPoolExecutor(max_workers=max(1, self.server.concurrency)) as pool:
            answers = list(pool.map(ask, jobs))
        for (rows, _), got in zip(jobs, answers, strict=True):
            for row, named in zip(rows, got, strict=True):
                for token, value in named.items():
                    if token < width:  # (vLLM clamps at -9999.0: JSON has no infinity; kept finite)
                        out[row, token] = value
        return out
