"""A small OpenAI-compatible chat-completions server on 127.0.0.1, answering with the local LM selector.

It stands where vLLM or Ray Serve LLM would: it only sees the request (messages + ``tools`` with
their JSON schemas), builds the candidate list from it, and decodes a tool call with the trained
selector LM under the same constraints. Requests are recorded so tests can check their shape.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from chat_server import ChatCompletionsServer

from components.serving.catalog import Param, Tool, ToolCatalog
from components.serving.selector_lm import LMSelector


def tools_from_request(tools: list[dict[str, Any]]) -> ToolCatalog:
    """Candidates as the request describes them (function name as id, schema title as name)."""
    out = {}
    for entry in tools:
        fn = entry["function"]
        schema = fn.get("parameters") or {}
        props = schema.get("properties") or {}
        required = tuple(Param(n, props.get(n, {}).get("type", "string")) for n in schema.get("required", []))
        out[fn["name"]] = Tool(
            fn["name"], schema.get("title") or fn["name"], fn.get("description", ""), required
        )
    return ToolCatalog(tools=out, version="request")


class LocalChatServer(ChatCompletionsServer):
    """``POST /v1/chat/completions`` with tool calling; ``offer_unknown_tool`` makes it misbehave.

    Args:
        selector: Decodes the answers.
        delay_s: Extra latency per request (see :class:`ChatCompletionsServer`).
    """

    def __init__(self, selector: LMSelector, delay_s: float = 0.0) -> None:
        super().__init__(delay_s)
        self.selector = selector
        self.offer_unknown_tool = False
        self._lock = threading.Lock()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        catalog = tools_from_request(body["tools"])
        query = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        with self._lock:  # one decoder at a time (the model is shared)
            self.selector.catalog = catalog
            call = self.selector.select(query, [], list(catalog.tools))
        assert call is not None
        name = "tool_999" if self.offer_unknown_tool else call["tool"]
        fn = {"name": name, "arguments": json.dumps(call["arguments"])}
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c0", "type": "function", "function": fn}],
        }
        return {
            "id": "chatcmpl-local",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        }
