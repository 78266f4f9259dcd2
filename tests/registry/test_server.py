"""`toolscout registry server` is a real MLflow tracking server: versions logged through it are
stored with proxied artifacts and resolve to local directories by download."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from components.registry import ModelRegistry, RegistrySettings, resolve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """The server on a free loopback port, over a store under tmp_path; stopped by its PID."""
    port = free_port()
    cli = Path(sys.executable).with_name("toolscout")
    proc = subprocess.Popen(
        [str(cli), "registry", "server", f"registry.root={tmp_path / 'store'}", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its gunicorn/uvicorn workers go with it
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if requests.get(f"{url}/health", timeout=10).ok:
                break
        except requests.RequestException:  # not listening yet, or busy starting
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"registry server did not come up (exit code {proc.poll()})")
        time.sleep(0.5)
    try:
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_versions_through_the_server_resolve_by_download(server, tmp_path):
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "config.json").write_text(json.dumps({"method": "bm25"}))
    (artifact / "index.npy").write_bytes(b"\x93NUMPY")
    # A client as on a cluster node: the tracking URI names the server, the root is its own.
    settings = RegistrySettings(tracking_uri=server, root=str(tmp_path / "client"))
    registry = ModelRegistry(settings)
    version = registry.log_version("served", str(artifact), metrics={"valid/ndcg_at_3": 0.7})
    registry.promote("served", version.number)
    assert version.source.startswith("mlflow-artifacts:")  # the server proxies the artifact store
    local = resolve("models:/served@champion", settings)
    assert local == str(tmp_path / "client" / "versions" / "served" / "v1")
    assert not os.path.islink(local)  # downloaded, not linked
    assert sorted(os.listdir(local)) == ["config.json", "index.npy"]
    assert (tmp_path / "store" / "mlflow.db").exists()  # the server's sqlite store
    # The server's artifact store holds the files (what a cluster would keep on s3://).
    stored = [p.name for p in (tmp_path / "store" / "artifacts").rglob("*") if p.is_file()]
    assert sorted(stored) == ["config.json", "index.npy"]
