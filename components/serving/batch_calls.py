"""How the deployments load new versions and answer each request of a batch as if it were alone.

``@serve.batch`` hands a deployment method a list and wants a list back, with no per-item failure
and no per-item arguments. The helpers here keep a batch from changing any one request's answer:
a model call that raises is retried item by item (:func:`call_each`), and the retriever ranks each
distinct ``k`` separately (:func:`rank_by_k`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12

from components.generative.chat_endpoint import EndpointUnavailable
from components.generative.deadline import DeadlinePassed

logger = logging.getLogger("ray.serve")

Item = TypeVar("Item")
Result = TypeVar("Result")
Loaded = TypeVar("Loaded")


# The deployments with a ``@serve.batch`` method, which the app's ``batching`` arg may tune.
BatchedDeployment = Literal["Detector", "Retriever", "Selector", "QueryRewriter"]


class BatchOptions(TypedDict, total=False):
    """One deployment's entry in the app's ``batching`` arg, checked when the app is built: a size
    of 0 or 2.5 was only refused inside the replicas (a failed swap), and a misspelt deployment
    or key was ignored without a word."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    max_batch_size: Annotated[int, Field(ge=1)]
    batch_wait_timeout_s: Annotated[float, Field(ge=0.0)]


def apply_batching(method: Any, config: dict[str, Any]) -> None:
    """Apply ``max_batch_size`` / ``batch_wait_timeout_s`` from a user config to a batched method."""
    if "max_batch_size" in config:
        method.set_max_batch_size(int(config["max_batch_size"]))
    if "batch_wait_timeout_s" in config:
        method.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))


def applied_already(replica: Any, config: dict[str, Any]) -> bool:
    """Whether ``replica`` already applied this very user config; if not, it is recorded as the
    one being applied.

    Ray Serve calls ``reconfigure`` again with an unchanged user config when only the replica's
    rank changes (ranks are renumbered after a scale-down or a replacement;
    ``ray/serve/_private/replica.py``). Loading the model again then held two copies in memory,
    took CPU from serving, emptied the caches, and could overlap a real swap: the stale load
    finishing last put the old version back.
    """
    if getattr(replica, "_applied_config", None) == config:
        return True
    replica._applied_config = copy.deepcopy(config)
    return False


class ModelUserConfig(BaseModel):
    """The keys a Detector or Retriever user config must get right before anything is loaded. The
    docs tell operators to hot-swap by writing a user config by hand: one without ``artifact``, or
    with ``cache_size: -1``, raised outside the guarded load and took the replica down."""

    model_config = ConfigDict(extra="allow")  # the other keys are the model loader's to check
    artifact: Annotated[str, Field(min_length=1)]
    cache_size: Annotated[int, Field(ge=0)] = 0
    max_batch_size: Annotated[int, Field(ge=1)] = 1
    batch_wait_timeout_s: Annotated[float, Field(ge=0.0)] = 0.0


def usable_config(name: str, replica: Any, config: dict[str, Any], serving: bool) -> bool:
    """Whether ``config`` passes :class:`ModelUserConfig`; a bad one is logged and refused while
    the replica ``serving`` keeps its version (as :func:`load_new` does), and raises on a first load.

    Raises:
        ValueError: the replica's first config is bad (there is nothing to keep serving).
    """
    try:
        ModelUserConfig.model_validate(config)
        return True
    except ValidationError as e:
        message = f"{name}: bad user config: {e}"
        if not serving:
            raise ValueError(message) from e
        logger.error("%s; still serving the previous one", message)
        apply_failed(replica)
        return False


def apply_failed(replica: Any) -> None:
    """Forget the config :func:`applied_already` recorded: its load failed, and the next
    ``reconfigure`` (the same config again, after a rank change) tries it anew."""
    replica._applied_config = None


async def load_new(name: str, load: Callable[[], Loaded], serving: bool) -> tuple[bool, Loaded | None]:
    """``(True, load())``, run off the event loop; ``(False, None)`` if it raises while ``serving``.

    Serve stops a replica whose ``reconfigure`` raises, and every replacement gets the same user
    config and fails alike: one bad hot-swap would take the deployment down. So a failed swap is
    logged and the caller keeps the version it serves; a replica's first load (nothing
    ``serving`` yet) still raises, since there is nothing to answer with.
    """
    try:
        return True, await asyncio.to_thread(load)
    except Exception:
        if not serving:
            raise
        logger.exception("%s: loading the new user config failed; still serving the previous one", name)
        return False, None


def call_each(call: Callable[[list[Item]], list[Result]], items: list[Item]) -> list[Result | Exception]:
    """``call(items)``; if that raises, ``call([item])`` for each item, so only bad items fail.

    Returns one result per item, or the exception its own call raised (``@serve.batch`` has no
    per-item failure, so the deployment method raises it for that request alone).
    """
    try:
        return list(call(items))
    except (DeadlinePassed, EndpointUnavailable) as e:
        # Its callers stopped waiting, or the model's server does not answer: one by one would
        # only fail again, each item after another full timeout (a batch of 8, nine timeouts).
        return [e] * len(items)
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


def rank_by_k(rank: Callable[..., list[Result]], requests: list[tuple[str, int]]) -> list[Result | Exception]:
    """Each ``(text, k)``'s answer from ``rank(texts, k=k)`` (:meth:`RetrieverModel.retrieve`, or
    :meth:`RetrieverModel.retrieve_detected` for rankings paired with the model's own detection),
    ranked among the requests with the same ``k``.

    Ranking the whole batch once at its largest ``k`` and truncating would make a request's answer
    depend on its batch mates: a method's top-k is not always the prefix of its top-K (ties, e.g.
    duplicated tools, come out of ``torch.topk`` in a k-dependent order; beam searches widen with k).
    """
    by_k: dict[int, list[int]] = {}
    for i, (_, k) in enumerate(requests):
        by_k.setdefault(k, []).append(i)
    out: list[Any] = [[] for _ in requests]
    for k, indices in by_k.items():
        texts = [requests[i][0] for i in indices]
        rankings = call_each(partial(rank, k=k), texts)
        for i, ranking in zip(indices, rankings, strict=True):
            out[i] = ranking
    return out


def raise_failed(result: Result | Exception) -> Result:
    """A batch item's result, or its exception raised for this request alone."""
    if isinstance(result, Exception):
        raise result
    return result
