"""A bare FastAPI app behind one of the ingress's ASGI middlewares, for testing it without Serve."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from components.serving.errors import install_error_handlers


def guarded_client(middleware: type, method: str, path: str, **options: Any) -> TestClient:
    """A client of an app whose one route (``method`` on ``path``) answers ``{"ok": true}``,
    behind ``middleware`` with ``options`` and the app's JSON error handlers."""
    app = FastAPI()
    install_error_handlers(app)

    async def ok() -> dict:
        return {"ok": True}

    app.add_api_route(path, ok, methods=[method.upper()])
    app.add_middleware(middleware, **options)
    return TestClient(app)
