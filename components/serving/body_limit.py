"""Request bodies larger than any valid request are refused before they are read.

The ingress parses a whole body before the schema's limits (a 2,000-character query, 20 turns of
history) apply, so without a cap any client (any client at all, when no API key is set) could
make a replica read and parse a body of any size. The cap is well above the largest valid
request: 21 texts of 2,000 characters, each character up to 12 bytes as a JSON ``\\u`` escape
pair, is about 0.5 MB.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException

from components.serving.errors import error

MAX_BODY_BYTES = 1 << 20
TOO_LARGE = f"the request body is larger than {MAX_BODY_BYTES} bytes"


class BodyLimit:
    """A raw ASGI middleware answering 413 ``body_too_large`` to an HTTP request whose body is over
    ``limit`` bytes: at once from its ``Content-Length``, or, for a body sent in chunks, as soon as
    the bytes read pass the limit (raised as an :class:`HTTPException` from ``receive``, which the
    app's error handlers answer)."""

    def __init__(self, app: Any, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await error(413, "body_too_large", TOO_LARGE)(scope, receive, send)
            return
        read = 0

        async def limited() -> dict:
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.limit:
                    # FastAPI's HTTPException: FastAPI passes it on from body parsing (any other
                    # exception there becomes a 400).
                    raise HTTPException(413, detail=TOO_LARGE)
            return message

        await self.app(scope, limited, send)
