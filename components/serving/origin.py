"""Requests from web pages of other sites are refused: the guard against DNS rebinding.

A page on ``attacker.example`` whose name is re-pointed at 127.0.0.1 can send requests to a
toolscout server on this machine that the browser treats as same-origin, so CORS never stops
them; they still carry ``Origin: http://attacker.example``. MCP's streamable HTTP transport makes
the check a MUST ("Servers MUST validate the Origin header on all incoming connections"), and
the HTTP door is as reachable, so the guard covers the whole app.

Agents, SDKs and curl send no ``Origin`` and pass. A browser page on a loopback name (the API
docs' "try it out" at ``http://127.0.0.1:8000/docs``) passes too: a rebinding page's origin is
the attacker's own name, never a loopback one. Other sites pass only when listed in
``$TOOLSCOUT_ALLOWED_ORIGINS`` (comma-separated, e.g. ``https://console.example.com``), which the
Ingress constructor sets from the app's ``allowed_origins`` arg.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from components.serving.errors import error

ORIGINS_ENV = "TOOLSCOUT_ALLOWED_ORIGINS"
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


class OriginGuard:
    """A raw ASGI middleware answering 403 ``forbidden_origin`` to a request whose ``Origin`` is
    neither a loopback name nor listed in ``$TOOLSCOUT_ALLOWED_ORIGINS`` (read when the app
    builds its middleware, after the Ingress constructor set it)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        listed = os.environ.get(ORIGINS_ENV, "").split(",")
        self.allowed = frozenset(o.strip().rstrip("/").lower() for o in listed if o.strip())

    def permits(self, origin: str) -> bool:
        """Whether a request with ``Origin: origin`` may go on (``null``, sent by sandboxed and
        ``file://`` pages, may not)."""
        origin = origin.strip().rstrip("/").lower()
        if origin in self.allowed:
            return True
        try:
            return urlsplit(origin).hostname in LOOPBACK
        except ValueError:  # not a URL at all
            return False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            origin = dict(scope.get("headers") or []).get(b"origin")
            if origin is not None and not self.permits(origin.decode("latin-1")):
                message = "requests from this web origin are refused (list it in allowed_origins)"
                await error(403, "forbidden_origin", message)(scope, receive, send)
                return
        await self.app(scope, receive, send)
