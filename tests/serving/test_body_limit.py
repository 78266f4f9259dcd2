"""The body cap on its own (no Serve): over-size bodies are refused, whether announced or streamed."""

from __future__ import annotations

import json

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from components.serving.body_limit import MAX_BODY_BYTES, BodyLimit
from components.serving.errors import install_error_handlers
from components.serving.schemas import MAX_HISTORY, MAX_QUERY_CHARS, MAX_TOP_K, SelectRequest


class Body(BaseModel):
    query: str


def client(limit: int) -> tuple[TestClient, list[str]]:
    app = FastAPI()
    install_error_handlers(app)
    seen: list[str] = []

    @app.post("/v1/select")
    async def select(body: Body) -> dict:
        seen.append(body.query)
        return {"ok": True}

    app.add_middleware(BodyLimit, limit=limit)
    return TestClient(app), seen


def chunks(data: bytes, size: int = 16):
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_a_body_over_the_cap_is_a_413_announced_or_streamed_and_never_reaches_the_endpoint():
    http, seen = client(limit=100)
    headers = {"Content-Type": "application/json"}
    small, large = b'{"query": "weather"}', b'{"query": "' + b"a" * 200 + b'"}'
    assert http.post("/v1/select", content=small, headers=headers).status_code == 200
    announced = http.post("/v1/select", content=large, headers=headers)
    # A generator is sent in chunks with no Content-Length: counted as it is read.
    streamed = http.post("/v1/select", content=chunks(large), headers=headers)
    assert "content-length" not in {k.lower() for k in streamed.request.headers}
    for r in (announced, streamed):
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large", r.text
    assert seen == ["weather"]
    # At the cap exactly it is read.
    exact = b'{"query": "' + b"b" * (100 - len(b'{"query": ""}')) + b'"}'
    assert len(exact) == 100
    assert http.post("/v1/select", content=chunks(exact), headers=headers).status_code == 200


def test_the_cap_is_above_the_largest_valid_request():
    # Every text at its limit, every character one that JSON escapes as a pair (12 bytes).
    text = "\U0001f600" * MAX_QUERY_CHARS
    request = {
        "query": text,
        "history": [text] * MAX_HISTORY,
        "top_k": MAX_TOP_K,
        "needs_tool_threshold": 0.5,
    }
    body = json.dumps(request)  # ensure_ascii: "\\ud83d\\ude00" per character
    SelectRequest.model_validate_json(body)
    assert len(body.encode()) < MAX_BODY_BYTES
