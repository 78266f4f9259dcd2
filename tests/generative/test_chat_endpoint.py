"""The one chat-completions client: the server's error reaches the caller, except Ray Serve LLM's
adapter-load race, which one retry answers."""

from __future__ import annotations

from typing import Any

import pytest
from chat_server import ChatCompletionsServer, HTTPFailure

from components.generative.chat_endpoint import LORA_LOAD_RACE, ChatEndpoint, ChatEndpointError


class FailingFirst(ChatCompletionsServer):
    """Fails the first request with HTTP 500 and ``message``, then answers "flights to rome"."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        if len(self.requests) == 1:
            raise HTTPFailure(500, self.message)
        return {"choices": [{"message": {"role": "assistant", "content": "flights to rome"}}]}


def test_a_lost_adapter_load_race_is_retried_once_and_answered():
    # What Ray Serve LLM 2.60 answers the loser of two concurrent first requests for an adapter.
    message = f"Failed to load lora model: The lora adapter 'smollm2:qg' {LORA_LOAD_RACE}."
    with FailingFirst(message) as server:
        endpoint = ChatEndpoint(endpoint=server.url, model="smollm2:qg")
        assert endpoint.complete("rewrite", "cheap flights to rome", 8) == "flights to rome"
        assert len(server.requests) == 2 and server.requests[0]["body"] == server.requests[1]["body"]


def test_any_other_server_error_is_raised_with_the_servers_words():
    with FailingFirst("model 'nope' does not exist") as server:
        endpoint = ChatEndpoint(endpoint=server.url, model="nope")
        with pytest.raises(ChatEndpointError, match=r"HTTP Error 500.*model 'nope' does not exist"):
            endpoint.complete("rewrite", "cheap flights to rome", 8)
        assert len(server.requests) == 1  # no retry
