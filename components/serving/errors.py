"""JSON errors instead of 500s, and the optional API key, for the FastAPI ingress.

Every error body is ``{"error": {"code", "message", "details"}}``:

=====  ==========================  ===================================================
400    ``invalid_json``            the body is not JSON
401    ``unauthorized``            an API key is configured and the request lacks it
404    ``not_found`` / 405 ...     unknown route or method (Starlette's, reshaped)
415    ``unsupported_media_type``  a body sent with a non-JSON ``Content-Type``
422    ``invalid_request``         wrong types, unknown fields, blank / long query, top_k range
503    ``backend_unavailable``     a model deployment failed after retries
=====  ==========================  ===================================================
"""

from __future__ import annotations

import hmac
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

API_KEY_ENV = "TOOLSCOUT_API_KEY"


def error(status: int, code: str, message: str, details: list[dict[str, Any]] | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "details": details or []}}, status_code=status
    )


def _is_json(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _details(exc: RequestValidationError) -> list[dict[str, Any]]:
    # Pydantic's ``ctx`` may hold exception objects; keep the JSON-safe parts only.
    return [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in exc.errors()
    ]


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """Tell apart a wrong content type, a body that is not JSON, and a JSON body that breaks the schema."""
    content_type = request.headers.get("content-type", "")
    if content_type and not _is_json(content_type):
        return error(415, "unsupported_media_type", f"send application/json, not {content_type!r}")
    details = _details(exc)
    if any(d["type"] == "json_invalid" for d in details):
        return error(400, "invalid_json", "the request body is not valid JSON", details)
    return error(422, "invalid_request", "the request does not match the schema (see /docs)", details)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    response = error(exc.status_code, code, str(exc.detail))
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)


class ApiKeyMiddleware:
    """Requires ``Authorization: Bearer <key>`` on ``/v1/`` routes when ``$TOOLSCOUT_API_KEY`` is set.

    A raw ASGI middleware: it answers 401 before the body is read or validated, so unauthenticated
    clients learn nothing about the schema, and it costs one header lookup per request. The key is
    read from the replica's environment: a Kubernetes Secret (``deploy/rayservice.yaml``), or the
    app's ``api_key`` arg, which the Ingress constructor sets there before Serve builds the app. A
    Secret keeps the key out of the Serve config.
    """

    def __init__(self, app: Any, protected: tuple[str, ...] = ("/v1/",)) -> None:
        self.app = app
        self.protected = protected
        key = os.environ.get(API_KEY_ENV, "")
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.expected and scope["type"] == "http" and scope["path"].startswith(self.protected):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = error(401, "unauthorized", "missing or wrong API key (Authorization: Bearer ...)")
                response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
