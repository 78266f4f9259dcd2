"""A serving timeout stops generation itself, not only the wait for it: transformers' decoding and an
OpenAI-compatible endpoint's request end at the deadline with DeadlinePassed (llama.cpp's stream:
tests/generative/test_llamacpp.py; the deployments: tests/serving/test_rewriter.py)."""

from __future__ import annotations

import time

import pytest
from chat_server import ChatCompletionsServer
from tiny_lm import tiny_lm

from components.generative.chat_endpoint import ChatEndpoint, EndpointUnavailable
from components.generative.deadline import DeadlinePassed, check, deadline, time_left
from components.generative.generate import generate_texts


def test_an_inner_deadline_cannot_extend_an_outer_one_and_none_adds_no_limit():
    assert time_left() is None
    with deadline(0.0):
        with deadline(3600), pytest.raises(DeadlinePassed):
            check()
        with deadline(None):
            assert time_left() <= 0
    with deadline(3600), deadline(0.5):
        assert 0 < time_left() <= 0.5
    assert time_left() is None  # restored on the way out
    with pytest.raises(ValueError, match=">= 0"), deadline(-1):
        pass


def slowed(lm, seconds: float) -> list[int]:
    """Every forward pass of ``lm`` takes ``seconds`` longer; returns the list its calls are counted in."""
    calls: list[int] = []

    def hook(module, args, output):
        calls.append(1)
        time.sleep(seconds)

    lm.register_forward_hook(hook)
    return calls


def test_decoding_stops_at_the_deadline_instead_of_running_to_max_new_tokens():
    lm, tokenizer, _ = tiny_lm(tools=False)
    tokenizer.eos_token_id = None  # no early end: decoding runs to max_new_tokens unless stopped
    lm.generation_config.eos_token_id = None
    prompts = ["weather in paris"]
    calls = slowed(lm, 0.0)
    assert generate_texts(lm, tokenizer, prompts, max_new_tokens=40)  # no deadline: unchanged
    unbounded = len(calls)
    assert unbounded == 40

    calls = slowed(lm, 0.05)  # 40 passes now take 2 s or more
    with deadline(0.2), pytest.raises(DeadlinePassed):
        generate_texts(lm, tokenizer, prompts, max_new_tokens=40)
    assert len(calls) < unbounded  # stopped, not decoded on to the end and then dropped


class Slow(ChatCompletionsServer):
    def answer(self, body):
        return {"choices": [{"message": {"role": "assistant", "content": "weather paris"}}]}


def test_an_endpoint_is_waited_on_until_the_deadline_only():
    with Slow(delay_s=2.0) as server:
        endpoint = ChatEndpoint(endpoint=server.url, model="m", timeout_s=30.0)
        assert endpoint.rewrite("rewrite", ["weather in paris"], 8) == ["weather paris"]
        # Two texts: each request runs on the client's thread pool, which must see the deadline too.
        with deadline(0.2), pytest.raises(DeadlinePassed):
            endpoint.rewrite("rewrite", ["weather in paris", "flights to rome"], 8)


def test_an_answer_sent_slowly_is_not_waited_on_past_the_deadline_or_the_timeout():
    # The socket timeout bounds each read, not the call: a body trickling in for seconds was read
    # to its end under a 0.2 s deadline, and the late answer returned as if in time.
    with Slow(trickle_s=0.05) as server:  # about 3 s for its ~70-byte body
        endpoint = ChatEndpoint(endpoint=server.url, model="m", timeout_s=30.0)
        with deadline(0.2), pytest.raises(DeadlinePassed):
            endpoint.complete("rewrite", "weather in paris", 8)
        # Without a deadline, the endpoint's own timeout_s bounds the whole call too.
        quick = ChatEndpoint(endpoint=server.url, model="m", timeout_s=0.2)
        with pytest.raises(EndpointUnavailable, match="still coming in at the call's timeout"):
            quick.complete("rewrite", "weather in paris", 8)
