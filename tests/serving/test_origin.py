"""The Origin guard: pages of other sites are refused (DNS rebinding), agents and loopback pages pass."""

from __future__ import annotations

import pytest
from asgi_client import guarded_client
from fastapi.testclient import TestClient

from components.serving.origin import ORIGINS_ENV, OriginGuard


def client() -> TestClient:
    return guarded_client(OriginGuard, "post", "/mcp/")


@pytest.mark.parametrize(
    "origin, status",
    [
        (None, 200),  # an agent, an SDK, curl
        ("http://127.0.0.1:8000", 200),  # the API docs' "try it out" on this machine
        ("http://localhost", 200),
        ("http://[::1]:8000", 200),
        ("https://console.example.com", 200),  # listed
        ("HTTPS://Console.Example.com/", 200),  # the same origin, spelled otherwise
        ("http://attacker.example", 403),  # a rebinding page: its own name, resolved to 127.0.0.1
        ("https://console.example.com.attacker.example", 403),
        ("http://127.0.0.1.attacker.example", 403),
        ("null", 403),  # sandboxed and file:// pages
    ],
)
def test_only_agents_loopback_pages_and_listed_sites_pass(monkeypatch, origin, status):
    monkeypatch.setenv(ORIGINS_ENV, "https://console.example.com, https://other.example")
    headers = {"Origin": origin} if origin else {}
    r = client().post("/mcp/", json={}, headers=headers)
    assert r.status_code == status
    if status == 403:
        assert r.json()["error"]["code"] == "forbidden_origin"


def test_without_a_list_only_loopback_pages_pass(monkeypatch):
    monkeypatch.delenv(ORIGINS_ENV, raising=False)
    assert (
        client().post("/mcp/", json={}, headers={"Origin": "https://console.example.com"}).status_code == 403
    )
    assert client().post("/mcp/", json={}, headers={"Origin": "http://localhost:3000"}).status_code == 200
