"""JSON errors instead of 500s, and the optional API key, for the FastAPI ingress.

Every error body is ``{"error": {"code", "message", "details"}}``:

=====  ==========================  ===================================================
400    ``invalid_json``            the body is not JSON
401    ``unauthorized``            an API key is configured and the request lacks it
403    ``forbidden_origin``        sent by a web page of a site not allowed (:mod:`.origin`)
404    ``not_found`` / 405 ...     unknown route or method (Starlette's, reshaped)
415    ``unsupported_media_type``  a body sent without ``Content-Type`` or with a non-JSON one
422    ``invalid_request``         wrong types, unknown fields, blank / long query, top_k range
500    ``internal_error``          anything unexpected (a model raised); the traceback is
                                   logged in the replica, never sent
503    ``backend_unavailable``     a model deployment failed after retries or did not answer
                                   within the call timeout, or its model server (a vLLM
                                   endpoint) does not answer
=====  ==========================  ===================================================
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Collection
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

API_KEY_ENV = "TOOLSCOUT_API_KEY"

logger = logging.getLogger("ray.serve")


def error(status: int, code: str, message: str, details: list[dict[str, Any]] | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "details": details or []}}, status_code=status
    )


def _is_json(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _unsupported(content_type: str) -> str:
    """The 415 message: what was sent (or that nothing was) and what to send."""
    if not content_type:
        return "send the body with Content-Type: application/json (the request had no Content-Type)"
    return f"send application/json, not {content_type!r}"


async def require_json(request: Request) -> None:
    """Route dependency: the body must be declared JSON.

    FastAPI parses a body without ``Content-Type`` as JSON and would accept it; clients that omit
    the header are told so instead, the same way as clients that send a wrong one.
    """
    content_type = request.headers.get("content-type", "")
    if not _is_json(content_type):
        raise StarletteHTTPException(415, detail=_unsupported(content_type))


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
    # Checked first: without a JSON Content-Type, a body that fails to parse or validate is
    # a content-type mistake before it is a schema one.
    content_type = request.headers.get("content-type", "")
    if not _is_json(content_type):
        return error(415, "unsupported_media_type", _unsupported(content_type))
    details = _details(exc)
    if any(d["type"] == "json_invalid" for d in details):
        return error(400, "invalid_json", "the request body is not valid JSON", details)
    return error(422, "invalid_request", "the request does not match the schema (see /docs)", details)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # FastAPI raises a bare 400 when it cannot read a body as JSON for reasons other than a JSON
    # syntax error (bytes that are not UTF-8, nesting too deep, a number too long): as invalid as
    # the syntax errors validation_error names invalid_json, so it is named so too.
    codes = {
        400: "invalid_json",
        404: "not_found",
        405: "method_not_allowed",
        413: "body_too_large",
        415: "unsupported_media_type",
    }
    code = codes.get(exc.status_code, "http_error")
    response = error(exc.status_code, code, str(exc.detail))
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """Anything unexpected: a JSON 500 that names no internals; the traceback goes to the log."""
    logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error(500, "internal_error", "the server failed to answer this request; see its log")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    # Starlette runs the Exception handler in its outermost middleware, so it also covers errors
    # raised in other middleware (and re-raises afterwards, for the server's own accounting).
    app.add_exception_handler(Exception, internal_error)


def app_path(scope: dict[str, Any]) -> str:
    """The request path inside the app: ``path`` without the ``root_path`` it is mounted under.

    ASGI servers put the mount prefix (Serve's ``route_prefix``, a proxy's ``--root-path``) in
    ``root_path``, and ``path`` includes it; some leave it out of ``path``, which is then used as is.
    """
    path, root = scope.get("path", ""), scope.get("root_path", "").rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :] or "/"
    return path


def bearer_token(header: bytes) -> bytes:
    """The token of an ``Authorization: Bearer <token>`` header value, or ``b""``. The scheme's
    case is not significant (RFC 9110 section 11.1, RFC 6750): ``bearer k`` was refused before,
    and some HTTP clients send it so."""
    scheme, _, token = header.strip().partition(b" ")
    return token.strip(b" ") if scheme.lower() == b"bearer" else b""


class ApiKeyMiddleware:
    """Requires ``Authorization: Bearer <key>`` on every path but ``public`` when ``$TOOLSCOUT_API_KEY``
    is set.

    An allow-list rather than a list of protected prefixes: a route added later, an unknown path, or
    the app mounted under a prefix is protected by default. The path is compared without the mount
    prefix (:func:`app_path`). A raw ASGI middleware: it answers 401 before the body is read or
    validated, so unauthenticated clients learn nothing about the schema, and it costs one header
    lookup per request. The key is read from the replica's environment: a Kubernetes Secret
    (``deploy/rayservice.yaml``), or the app's ``api_key`` arg, which the Ingress constructor sets
    there before Serve builds the app. A Secret keeps the key out of the Serve config.

    Args:
        app: The ASGI app to guard.
        public: Exact app paths open without the key (liveness, the API docs).
    """

    def __init__(self, app: Any, public: Collection[str] = ("/healthz",)) -> None:
        self.app = app
        self.public = frozenset(public)
        key = os.environ.get(API_KEY_ENV, "")
        self.expected = key.encode() if key else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.expected and scope["type"] == "http" and app_path(scope) not in self.public:
            given = bearer_token(dict(scope.get("headers") or []).get(b"authorization", b""))
            if not hmac.compare_digest(given, self.expected):
                response = error(401, "unauthorized", "missing or wrong API key (Authorization: Bearer ...)")
                response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
