"""A time limit on generation, set by whoever stops waiting for it and honoured by every engine.

A serving deployment answers without its rewrite (or its call) once its timeout passes, but
``asyncio.wait_for`` cannot stop the thread that decodes: without a limit the thread ran on to
``max_new_tokens``, holding the replica's cores, and the next batch, queued behind it, timed out too.
The deployment now opens :func:`deadline` around the thread it starts (``asyncio.to_thread`` copies
context variables into that thread) and each engine stops when it passes:

- transformers' ``generate`` gets the time left as ``max_time`` (:mod:`.generate`);
- llama.cpp streams its tokens and stops reading (:mod:`.llamacpp`);
- an OpenAI-compatible endpoint is waited on for at most the time left (:mod:`.chat_endpoint`);
- a hand-written decoding loop calls :func:`check` before each forward pass.

Each raises :class:`DeadlinePassed` rather than return a cut-short answer, so a partial rewrite or
call never passes for a finished one. Without a deadline (training, benchmarks) nothing changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# The monotonic time by which generation must stop; None: no limit.
_DEADLINE: ContextVar[float | None] = ContextVar("toolscout_generation_deadline", default=None)


class DeadlinePassed(TimeoutError):
    """Generation stopped because its caller stopped waiting for it."""


@contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Generation started inside the block (in this thread, or a thread it starts with the context
    copied, as ``asyncio.to_thread`` does) stops ``seconds`` from now; an enclosing, earlier
    deadline still holds. ``None`` adds no limit."""
    if seconds is not None and seconds < 0:
        raise ValueError(f"a deadline is a time left in seconds, >= 0; got {seconds}")
    at = None if seconds is None else time.monotonic() + seconds
    outer = _DEADLINE.get()
    token = _DEADLINE.set(at if outer is None else outer if at is None else min(at, outer))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def time_left() -> float | None:
    """Seconds until the current deadline (negative once it has passed); None without one."""
    at = _DEADLINE.get()
    return None if at is None else at - time.monotonic()


def check() -> None:
    """Raise :class:`DeadlinePassed` if the current deadline has passed."""
    left = time_left()
    if left is not None and left <= 0:
        raise DeadlinePassed(f"generation stopped: its deadline passed {-left:.3f} s ago")
