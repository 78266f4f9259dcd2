"""Plain-text rules every generation engine shares (kept free of torch: the endpoint and llama.cpp
engines import it without loading a model framework)."""

from __future__ import annotations

from collections.abc import Callable

LINE_BREAK = ("\n",)


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
