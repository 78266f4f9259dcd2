"""How a batched deployment call answers each request as if it were alone.

``@serve.batch`` hands a deployment method a list and wants a list back, with no per-item failure
and no per-item arguments. The helpers here keep a batch from changing any one request's answer:
a model call that raises is retried item by item (:func:`call_each`), and the retriever ranks each
distinct ``k`` separately (:func:`rank_by_k`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from components.serving.models import Ranking, RetrieverModel

logger = logging.getLogger("ray.serve")

Item = TypeVar("Item")
Result = TypeVar("Result")


def call_each(call: Callable[[list[Item]], list[Result]], items: list[Item]) -> list[Result | Exception]:
    """``call(items)``; if that raises, ``call([item])`` for each item, so only bad items fail.

    Returns one result per item, or the exception its own call raised (``@serve.batch`` has no
    per-item failure, so the deployment method raises it for that request alone).
    """
    try:
        return list(call(items))
    except Exception as batch_error:
        if len(items) == 1:
            return [batch_error]
        logger.warning("a batch of %d failed (%r); retrying its items one by one", len(items), batch_error)
    out: list[Result | Exception] = []
    for item in items:
        try:
            out.extend(call([item]))
        except Exception as e:
            out.append(e)
    return out


def rank_by_k(model: RetrieverModel, requests: list[tuple[str, int]]) -> list[Ranking | Exception]:
    """Each ``(text, k)``'s top-``k``, ranked among the requests with the same ``k``.

    Ranking the whole batch once at its largest ``k`` and truncating would make a request's answer
    depend on its batch mates: a method's top-k is not always the prefix of its top-K (ties, e.g.
    duplicated tools, come out of ``torch.topk`` in a k-dependent order; beam searches widen with k).
    """
    by_k: dict[int, list[int]] = {}
    for i, (_, k) in enumerate(requests):
        by_k.setdefault(k, []).append(i)
    out: list[Ranking | Exception] = [[] for _ in requests]
    for k, indices in by_k.items():
        texts = [requests[i][0] for i in indices]
        rankings = call_each(partial(model.retrieve, k=k), texts)
        for i, ranking in zip(indices, rankings, strict=True):
            out[i] = ranking
    return out


def raise_failed(result: Result | Exception) -> Result:
    """A batch item's result, or its exception raised for this request alone."""
    if isinstance(result, Exception):
        raise result
    return result
