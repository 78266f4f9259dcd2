"""Plain-text rules every generation engine shares (kept free of torch: the endpoint and llama.cpp
engines import it without loading a model framework)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

LINE_BREAK = ("\n",)
log = logging.getLogger(__name__)


def first_line(text: str) -> str:
    """A generation cut at its first line break, stripped (rewrites are one line)."""
    return text.strip().split("\n", 1)[0].strip()


def rewrite_line(complete: Callable[..., str], text: str) -> str:
    """The first line of an answer to ``text``, decoded only up to its first line break; ``text``
    itself where that line is empty.

    ``complete(stop=...)`` generates the answer, cut before the first of the ``stop`` strings. Only
    the first line is kept, and on a CPU each generated token costs 8 to 16 ms
    (``benchmarks/results/llamacpp_rewrite.md``), so decoding stops there. An answer that opens with
    a line break is generated again without the stop: the kept line is always the whole answer's.
    """
    line = first_line(complete(stop=LINE_BREAK))
    if not line:
        line = first_line(complete(stop=()))
    return line or text


def fits_context(
    tokenize: Callable[[bytes], list[int]], n_ctx: int, max_tokens: int, system: str, text: str
) -> bool:
    """Whether ``system`` + ``text`` and an answer of ``max_tokens`` fit a context of ``n_ctx``
    tokens, with room for a chat template's markers (32 tokens; SmolLM2's take about 15)."""
    return len(tokenize(f"{system}\n{text}".encode())) + max_tokens + 32 <= n_ctx


def fit_request(
    text: str,
    fits: Callable[[str], bool],
    tokenize: Callable[[str], list[int]],
    detokenize: Callable[[list[int]], str],
) -> str:
    """``text``, or the longest end of it (in whole tokens) with which its prompt ``fits``.

    The request is what gets cut, never the instruction or the chat template around it. Cut as a
    whole from the left, a long request's prompt lost its system instruction (the in-process
    generator, trained and run that way), and llama.cpp, which fails on a prompt past its context,
    kept such a request unrewritten: one request got two treatments by engine. The end is kept: a
    conversation's latest turn, and the ask of a long request, come last.

    Raises:
        ValueError: not even one token of a request fits beside the instruction.
    """
    if fits(text):
        return text
    if not fits(""):
        raise ValueError(
            "the system prompt and chat template alone fill the prompt budget: shorten the system "
            "prompt or raise the budget (query_max_length, or n_ctx for llama.cpp)"
        )
    ids = tokenize(text)
    lo, hi = 0, len(ids)  # an end of lo tokens fits, one of hi does not (the whole text)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(detokenize(ids[-mid:]).strip()):
            lo = mid
        else:
            hi = mid
    if lo == 0:  # room for the instruction but not one token of a request: as good as none
        raise ValueError(
            "the prompt budget leaves no room for a request beside the system prompt and chat "
            "template: raise the budget (query_max_length, or n_ctx for llama.cpp)"
        )
    return detokenize(ids[-lo:]).strip()


def fit_context(
    tokenize: Callable[[bytes], list[int]],
    detokenize: Callable[[list[int]], bytes],
    n_ctx: int,
    max_tokens: int,
    system: str,
    text: str,
) -> str:
    """``text`` cut to its end (:func:`fit_request`) so that ``system``, it and an answer of
    ``max_tokens`` fit a context of ``n_ctx`` tokens (:func:`fits_context`), for an engine that
    tokenizes bytes (llama.cpp)."""
    fits = partial(fits_context, tokenize, n_ctx, max_tokens, system)
    request = fit_request(
        text,
        fits,
        lambda t: tokenize(t.encode()),
        lambda ids: detokenize(ids).decode(errors="ignore"),  # a cut can split a character's bytes
    )
    if request != text:
        log.info("a %d-character request cut to its last %d to fit n_ctx %d", len(text), len(request), n_ctx)
    return request
