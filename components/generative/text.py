"""Plain-text rules every generation engine shares (kept free of torch: the endpoint and llama.cpp
engines import it without loading a model framework)."""

from __future__ import annotations

import logging
from collections.abc import Callable

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


def rewrite_in_context(complete: Callable[..., str], text: str, fits: Callable[[str], bool]) -> str:
    """:func:`rewrite_line`, or ``text`` itself when its prompt does not fit the engine's context.

    llama.cpp fails on a prompt past ``n_ctx`` (a ValueError, worded by where it overflows): one
    long request stopped a whole evaluation, where the in-process LM cuts its prompts to
    ``query_max_length``. Kept as it is, the request is what a failed rewrite leaves too.
    """
    if not fits(text):
        log.warning("a %d-character request does not fit the LM's context; kept unrewritten", len(text))
        return text
    return rewrite_line(complete, text)
