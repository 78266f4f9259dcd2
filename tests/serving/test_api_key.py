"""The API-key guard on its own (no Serve): which Authorization headers pass and which are refused."""

from __future__ import annotations

import pytest
from asgi_client import guarded_client
from fastapi.testclient import TestClient

from components.serving.errors import API_KEY_ENV, ApiKeyMiddleware, bearer_token


@pytest.fixture
def client(monkeypatch) -> TestClient:
    monkeypatch.setenv(API_KEY_ENV, "k-1")  # read when the app builds its middleware
    return guarded_client(ApiKeyMiddleware, "get", "/v1/tools")


@pytest.mark.parametrize(
    "header, status",
    [
        ("Bearer k-1", 200),
        # The scheme's case is not significant (RFC 9110 11.1): these were refused.
        ("bearer k-1", 200),
        ("BEARER k-1", 200),
        ("Bearer   k-1", 200),  # 1*SP between scheme and token
        (None, 401),
        ("Bearer k-2", 401),
        ("Bearer k-1x", 401),
        ("Bearer", 401),
        ("Basic k-1", 401),
        ("k-1", 401),
        ("Bearerk-1", 401),
    ],
)
def test_the_key_passes_with_any_case_of_the_scheme_and_nothing_else_does(client, header, status):
    headers = {} if header is None else {"Authorization": header}
    r = client.get("/v1/tools", headers=headers)
    assert r.status_code == status, (header, r.text)
    if status == 401:
        assert r.json()["error"]["code"] == "unauthorized" and r.headers["WWW-Authenticate"] == "Bearer"


def test_bearer_token_reads_only_the_bearer_scheme():
    assert bearer_token(b"Bearer abc") == b"abc"
    assert bearer_token(b" bEaReR  abc ") == b"abc"
    assert bearer_token(b"Token abc") == b"" and bearer_token(b"") == b""
