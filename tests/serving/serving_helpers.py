"""Helpers shared by the serving tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from components.registry import ModelRegistry, RegistrySettings

VLLM_PYTHON_ENV = "TOOLSCOUT_VLLM_PYTHON"


NO_VLLM = (
    "no Python environment with vLLM: build one with deploy/vllm_cpu_env.sh (a CPU host; ray[llm] "
    f"on GPU) and set {VLLM_PYTHON_ENV} to its interpreter"
)


def find_vllm_python() -> str | None:
    """The interpreter of an environment with vLLM: ``$TOOLSCOUT_VLLM_PYTHON``, or this one if it
    has vLLM; None if neither."""
    python = os.environ.get(VLLM_PYTHON_ENV)
    if python:
        return python
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def vllm_python() -> str:
    """The interpreter of an environment with vLLM, or a skip that says how to get one."""
    return find_vllm_python() or pytest.skip(NO_VLLM)


SELECTOR_LM = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 128,
    "max_length": 96,
}


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads (the tiny LMs here decode faster on one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def half_written(root: Path, version: str = "v0009") -> str:
    """A version dir whose config.json names a method but whose index is missing (a partial copy)."""
    path = root / "bm25" / version
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"method": "bm25"}))
    return str(path)


def private_registry(bm25_versions: dict[str, str], root: Path) -> ModelRegistry:
    """A registry of its own with both BM25 versions as model ``bm25``, v2 the champion (moving
    aliases in the shared one would leak into other tests)."""
    registry = ModelRegistry(RegistrySettings(root=str(root / "registry")))
    for name in ("default", "lucene"):
        registry.promote("bm25", registry.log_version("bm25", bm25_versions[name]).number)
    return registry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deploy(args: dict[str, Any], artifact: str | None = None, base: dict[str, Any] | None = None) -> None:
    """Deploy the toolscout app with these args, as ``serve run <config>`` does; with ``artifact``,
    hot-swap the retriever (and detector) to it through user configs; ``base`` is a Serve config
    file's contents whose deployment options apply."""
    from components.serving.deploy import deploy_config, serve_config
    from components.serving.swap import swap_artifact

    config = serve_config(args, base)
    deploy_config(swap_artifact(config, artifact) if artifact else config)


class Load:
    """Bounded background load over HTTP: ``threads`` clients, each looping until stopped, at most
    ``max_seconds`` and ``max_requests`` each. Records every status and the versions that answered:
    ``versions`` the ``model_version`` of each 200, ``answers`` its ``(model_version, versions)``."""

    def __init__(
        self, url: str, bodies: list[dict[str, Any]], threads: int = 2, max_seconds: float = 60.0
    ) -> None:
        import threading

        self.url, self.bodies, self.max_seconds = url, bodies, max_seconds
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.failures: list[str] = []
        self.versions: list[str] = []
        self.answers: list[tuple[str, dict[str, str | None]]] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, seed: int) -> None:
        import time

        import requests

        session = requests.Session()
        deadline = time.monotonic() + self.max_seconds
        i = seed
        while not self.stop.is_set() and time.monotonic() < deadline and i < seed + 5000:
            body = self.bodies[i % len(self.bodies)]
            i += 1
            try:
                r = session.post(f"{self.url}/v1/select", json=body, timeout=30)
                with self.lock:
                    if r.status_code == 200:
                        answer = r.json()
                        self.ok += 1
                        self.versions.append(answer["model_version"])
                        self.answers.append((answer["model_version"], answer["versions"]))
                    else:
                        self.failures.append(f"{r.status_code}: {r.text[:200]}")
            except requests.RequestException as e:
                with self.lock:
                    self.failures.append(repr(e))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def wait_for(self, condition, timeout_s: float = 60.0) -> None:
        """Wait until ``condition(self)`` holds (e.g. a version was seen)."""
        import time

        deadline = time.monotonic() + timeout_s
        while not condition(self):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"condition not met in {timeout_s}s (ok={self.ok}, failures={self.failures[:3]})"
                )
            time.sleep(0.1)


def mcp_session(url: str, work: Any, key: str | None = None) -> Any:
    """Run ``await work(client)`` with the MCP SDK's ``Client`` connected over streamable HTTP to
    ``url`` (the app's ``/mcp/``), with ``Authorization: Bearer key`` when given."""
    import asyncio

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def main() -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            return await work(client)

    return asyncio.run(main())


def unbatched(deployment, name: str) -> None:
    """Call ``deployment``'s ``@serve.batch`` method body on a batch of one: the batch queue needs a
    Serve replica around it, and test_deployments.py checks batching over Serve."""
    body = getattr(type(deployment), name).__wrapped__

    async def one(item):
        return (await body(deployment, [item]))[0]

    setattr(deployment, name, one)


def rewrite_corpus(data: Path, drop: str, rename: str) -> None:
    """Retire tool ``drop`` and give tool ``rename`` a new api_name, as a re-run ingest would."""
    records = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines()]
    kept = []
    for r in records:
        if r["_id"] == drop:
            continue
        if r["_id"] == rename:
            r["text"] = r["text"].replace("api_name:", "api_name:renamed_", 1)
        kept.append(r)
    (data / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    inner = getattr(error, "exceptions", None)
    return [e for sub in inner for e in leaves(sub)] if inner else [error]


def mcp_refusal_and_access(endpoint: str) -> None:
    """The MCP door is behind the same key: a client without it cannot even connect."""
    import pytest
    import requests
    from mcp import MCPError

    async def names(client):
        return sorted(t.name for t in (await client.list_tools()).tools)

    with pytest.raises(BaseException) as refused:  # the SDK raises an ExceptionGroup at connect
        mcp_session(endpoint, names)
    assert any(isinstance(e, MCPError) for e in leaves(refused.value)), refused.value
    r = requests.post(endpoint, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert mcp_session(endpoint, names, key="k-123") == ["find_tools", "get_tool"]
