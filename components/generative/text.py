"""Plain-text rules every generation engine shares (kept free of torch: the endpoint and llama.cpp
engines import it without loading a model framework)."""

from __future__ import annotations


def first_line(text: str) -> str:
    """A generation cut at its first line break, stripped (rewrites are one line)."""
    return text.strip().split("\n", 1)[0].strip()
