"""The one chat-completions client: the server's error reaches the caller, except Ray Serve LLM's
adapter-load race, which one retry answers."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
from chat_server import ChatCompletionsServer, HTTPFailure

from components.generative.chat_endpoint import (
    LORA_LOAD_RACE,
    ChatEndpoint,
    ChatEndpointError,
    EndpointUnavailable,
)


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


def test_a_server_that_does_not_speak_http_is_unavailable():
    # A bad status line is an http.client.HTTPException, not an OSError: it escaped unwrapped, and
    # the batch helpers (which give up at once on an unavailable server) retried item by item.
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_once() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    thread = threading.Thread(target=answer_once, daemon=True)
    thread.start()
    try:
        endpoint = ChatEndpoint(endpoint=f"http://127.0.0.1:{listener.getsockname()[1]}/v1", model="m")
        with pytest.raises(EndpointUnavailable, match=r"SSH-2\.0"):
            endpoint.complete("rewrite", "cheap flights to rome", 8)
    finally:
        thread.join(5)
        listener.close()


@pytest.mark.parametrize(
    "cfg, says",
    [
        ({"model": "m"}, r"needs 'endpoint' \(the server's base URL, with /v1\), got None"),
        ({"endpoint": "http://h/v1", "model": "m", "timeout_s": "30"}, "timeout_s must be a number > 0"),
        ({"endpoint": "http://h/v1", "model": "m", "timeout_s": 0}, "timeout_s must be a number > 0"),
        ({"endpoint": "http://h/v1", "model": "m", "concurrency": 0}, "concurrency must be an integer >= 1"),
        ({"endpoint": "http://h/v1", "model": "m", "api_key_env": 3}, "api_key_env must be"),
    ],
)
def test_an_endpoint_setting_of_the_wrong_kind_is_refused_naming_it(cfg, says):
    # A missing endpoint was a TypeError; a quoted "30" passed and failed at the first request.
    with pytest.raises(ValueError, match=f"querygen.generator: .*{says}"):
        ChatEndpoint.from_config(cfg, "querygen.generator")
