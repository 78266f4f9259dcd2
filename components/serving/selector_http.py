"""Selection by an OpenAI-compatible chat endpoint (vLLM, Ray Serve LLM, or any such server).

The retrieved candidates become the request's ``tools`` (function calling), each with its
parameter schema, and ``tool_choice: "required"`` asks for exactly one call; servers that support
it constrain decoding to the schemas (vLLM's guided decoding). The answer is checked here as well:
a tool that was not offered, arguments that are not a JSON object, or a missing required argument
make the call ``None`` rather than something the agent would execute.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from components.generative.chat_endpoint import ChatEndpointError, post_chat_completion
from components.serving.catalog import ToolCatalog

logger = logging.getLogger(__name__)

SYSTEM = (
    "You route a user's request to exactly one of the offered tools and fill its arguments from the "
    "request. Call the single best tool."
)


class SelectorHTTPError(RuntimeError):
    """The endpoint could not be reached or answered with something that is not a chat completion."""


class OpenAISelector:
    """Calls ``POST {url}/chat/completions`` (``url`` like ``http://host:8000/v1``).

    Args:
        url: Base URL including ``/v1``.
        model: The served model's name.
        catalog: Tools with their parameter schemas.
        api_key_env: Environment variable holding the endpoint's key, if it needs one.
        timeout_s: Per-request timeout.
        max_tokens: Cap on the answer's tokens. A call is short; without a cap a small model that
            repeats itself inside an argument string decodes until the context is full (minutes on
            a CPU engine) and the truncated call is refused anyway.
    """

    # Each call waits on the endpoint, not on this process: a batch's calls may run at once.
    concurrent_calls = True

    def __init__(
        self,
        url: str,
        model: str,
        catalog: ToolCatalog,
        api_key_env: str | None = None,
        timeout_s: float = 30.0,
        max_tokens: int = 160,
    ) -> None:
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.model, self.catalog, self.timeout_s, self.max_tokens = model, catalog, timeout_s, max_tokens
        self.api_key = os.environ.get(api_key_env) if api_key_env else None

    def request_body(self, query: str, history: list[str], candidates: list[str]) -> dict[str, Any]:
        """The chat-completions request: history as earlier user turns, candidates as functions."""
        tools = []
        for i, tool_id in enumerate(candidates):
            tool = self.catalog.tools.get(tool_id)
            if tool is not None:  # function names must match ^[a-zA-Z0-9_-]+$: index, not the tool id
                fn = {"name": f"tool_{i}", "description": tool.description, "parameters": tool.json_schema()}
                tools.append({"type": "function", "function": fn})
        messages = [{"role": "system", "content": SYSTEM}]
        messages += [{"role": "user", "content": turn} for turn in history]
        messages.append({"role": "user", "content": query})
        return {
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "tool_choice": "required",
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
        }

    def post(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return post_chat_completion(self.endpoint, body, self.api_key, self.timeout_s)
        except ChatEndpointError as e:
            raise SelectorHTTPError(str(e)) from e

    def parse(self, answer: dict[str, Any], candidates: list[str]) -> dict[str, Any] | None:
        """The validated call in ``answer``, or ``None`` if it names no offered tool or breaks the schema."""
        try:
            message = answer["choices"][0]["message"]
        except (KeyError, IndexError, TypeError) as e:
            raise SelectorHTTPError(f"{self.endpoint}: not a chat completion: {str(answer)[:200]}") from e
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
            # (A null message or a list of strings was an AttributeError, not the selector's error.)
            raise SelectorHTTPError(
                f"{self.endpoint}: tool_calls is not a list of calls: {str(answer)[:200]}"
            )
        if not calls:
            return None
        fn = calls[0].get("function") if isinstance(calls[0].get("function"), dict) else {}
        name = str(fn.get("name", ""))
        digits = name[5:]
        index = int(digits) if name.startswith("tool_") and digits.isascii() and digits.isdigit() else -1
        if not 0 <= index < len(candidates) or candidates[index] not in self.catalog.tools:
            return None
        raw = fn.get("arguments") or "{}"
        try:  # a JSON string, as OpenAI sends it; some servers send the object itself
            arguments = raw if isinstance(raw, dict) else json.loads(raw)
        except (json.JSONDecodeError, TypeError):
            return None
        tool = self.catalog.tools[candidates[index]]
        # The server's guided decoding may or may not have held it to the schema: check it here.
        problem = tool.argument_errors(arguments)
        if problem:
            logger.warning("%s: the endpoint's call breaks the tool's schema: %s", self.endpoint, problem)
            return None
        return {"tool": tool.id, "arguments": arguments}

    def select(self, query: str, history: list[str], candidates: list[str]) -> dict[str, Any] | None:
        body = self.request_body(query, history, candidates)
        if not body["tools"]:
            return None  # nothing retrieved (or nothing in the catalog): no call, and no request,
            # since OpenAI-compatible servers refuse an empty ``tools`` list (vLLM: HTTP 400)
        return self.parse(self.post(body), candidates)
