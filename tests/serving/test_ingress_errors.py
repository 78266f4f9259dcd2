"""The ingress's answers when a model deployment fails: what reaches the client, and what does not."""

from __future__ import annotations

import asyncio

from ray.exceptions import ActorDiedError

from components.serving.ingress import BackendUnavailable, Ingress
from components.serving.schemas import SelectRequest


class Method:
    """One deployment method as a handle exposes it (``.remote(...)`` returns an awaitable)."""

    def __init__(self, answer):
        self.answer, self.calls = answer, 0

    def remote(self, *args):
        self.calls += 1

        async def reply():
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer(*args) if callable(self.answer) else self.answer

        return reply()


class Handle:
    def __init__(self, **methods):
        self.__dict__.update(methods)


DIED = ActorDiedError()  # Ray's message names the node IP, actor id and PID of the dead replica
DETECT = {"probability": 0.9, "threshold": 0.5, "version": "bm25/v1"}


def unavailable(ingress: Ingress) -> str:
    """What the client is told when ``ingress`` answers a request with ``BackendUnavailable``."""

    async def scenario() -> str:
        try:
            await ingress.answer(SelectRequest(query="weather in Paris"))
        except BackendUnavailable as e:
            return str(e)
        raise AssertionError("the failing deployment was not reported as unavailable")

    return asyncio.run(scenario())


def test_a_deployment_that_keeps_dying_is_a_503_that_names_no_internals():
    retrieve = Method(DIED)
    said = unavailable(Ingress(Handle(detect=Method(DETECT)), Handle(retrieve=retrieve), retries=1))
    assert retrieve.calls == 2  # tried again once on another replica
    assert said == "a model deployment did not answer after 2 tries; try again"
    assert "actor" not in said.lower() and "pid" not in said.lower()


def test_a_model_server_that_does_not_answer_is_a_503_tried_once():
    # A Retriever whose LM runs on a vLLM endpoint that is down raised EndpointUnavailable, which
    # reached the client as a 500 internal error; another replica would ask the same endpoint.
    from components.generative.chat_endpoint import EndpointUnavailable

    retrieve = Method(EndpointUnavailable("http://vllm:8000/v1/completions: connection refused"))
    said = unavailable(Ingress(Handle(detect=Method(DETECT)), Handle(retrieve=retrieve), retries=3))
    assert said == "a model server did not answer; try again"
    assert retrieve.calls == 1


class Stuck:
    """A deployment method whose replica is stuck in a model call: it never answers."""

    def remote(self, *args):
        return asyncio.Event().wait()


def test_a_deployment_stuck_in_a_call_is_a_503_after_the_call_timeout():
    # A replica stuck in a model call (off its event loop) still passes Serve's health checks;
    # with no bound on the call, the client waited for ever.
    ingress = Ingress(Handle(detect=Method(DETECT)), Handle(retrieve=Stuck()), retries=3, call_timeout_s=0.05)
    assert unavailable(ingress) == "a model deployment did not answer within 0.05 s; try again"


def test_a_rewriter_that_fails_leaves_retrieval_on_the_query_as_sent():
    detect = Method(DETECT)
    retrieve = Method(lambda request: {"tools": [{"id": "t", "q": request[0]}], "version": "bm25/v1"})
    rewrite = Method(DIED)
    ingress = Ingress(
        Handle(detect=detect), Handle(retrieve=retrieve), rewriter=Handle(rewrite=rewrite), retries=0
    )
    out = asyncio.run(ingress.answer(SelectRequest(query="weather in Paris")))
    assert out["tools"] == [{"id": "t", "q": "weather in Paris"}] and rewrite.calls == 1
