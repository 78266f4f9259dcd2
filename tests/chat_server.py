"""An OpenAI-compatible ``POST /v1/chat/completions`` server (or another route: ``route``) on
127.0.0.1 for tests, standing where vLLM or Ray Serve LLM would. A subclass's
:meth:`ChatCompletionsServer.answer` makes the response from the request body; every request is
recorded (``{"body", "headers"}``) so tests can check its shape. Use it as a context manager; ``url``
ends in ``/v1``."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HTTPFailure(Exception):
    """Raised by :meth:`ChatCompletionsServer.answer` to answer with ``status`` and an OpenAI-style
    error body carrying ``message``, as a model server does when it cannot serve a request."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class ChatCompletionsServer:
    """Args:
    delay_s: Extra latency per request, as a remote model server has; ``max_in_flight`` records
        how many requests it held at once.
    trickle_s: A pause after each byte of the response body (a server sending its answer slowly).
    """

    route = "/v1/chat/completions"

    def __init__(self, delay_s: float = 0.0, trickle_s: float = 0.0) -> None:
        self.delay_s, self.trickle_s = delay_s, trickle_s
        self.requests: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0
        self._count = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                if self.path != server.route:
                    self.send_error(404)
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"body": body, "headers": dict(self.headers)})
                with server._count:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                status = 200
                try:
                    time.sleep(server.delay_s)
                    payload = json.dumps(server.answer(body)).encode()
                except HTTPFailure as e:
                    status, payload = e.status, json.dumps({"error": {"message": e.message}}).encode()
                finally:
                    with server._count:
                        server.in_flight -= 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    for at in range(0, len(payload), 1 if server.trickle_s else len(payload)):
                        self.wfile.write(payload[at : at + (1 if server.trickle_s else len(payload))])
                        self.wfile.flush()
                        time.sleep(server.trickle_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading (its deadline): nothing left to answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat completion for one request body."""
        raise NotImplementedError

    def __enter__(self) -> ChatCompletionsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
