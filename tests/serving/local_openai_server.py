"""A small OpenAI-compatible chat-completions server on 127.0.0.1, answering with the local LM selector.

It stands where vLLM or Ray Serve LLM would: it only sees the request (messages + ``tools`` with
their JSON schemas), builds the candidate list from it, and decodes a tool call with the trained
selector LM under the same constraints. Requests are recorded so tests can check their shape.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


class LocalChatServer:
    """``POST /v1/chat/completions`` with tool calling; ``offer_unknown_tool`` makes it misbehave.

    Args:
        selector: Decodes the answers.
        delay_s: Extra latency per request, as a remote model server has; ``max_in_flight`` records
            how many requests it held at once.
    """

    def __init__(self, selector: LMSelector, delay_s: float = 0.0) -> None:
        self.selector = selector
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.offer_unknown_tool = False
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        self._count = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"body": body, "headers": dict(self.headers)})
                with server._count:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.delay_s)
                    payload = json.dumps(server.answer(body)).encode()
                finally:
                    with server._count:
                        server.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

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

    def __enter__(self) -> LocalChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
