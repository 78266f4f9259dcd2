"""`toolscout registry server` is a real MLflow tracking server: versions logged through it are
stored with proxied artifacts and resolve to local directories by download."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def running_server(tmp_path, *overrides: str, env: dict[str, str] | None = None):
    """`toolscout registry server` on a free loopback port over a store under tmp_path; stopped
    (its whole process group) on the way out."""
    port = free_port()
    cli = Path(sys.executable).with_name("toolscout")
    argv = [str(cli), "registry", "server", f"registry.root={tmp_path / 'store'}", *overrides]
    proc = subprocess.Popen(
        [*argv, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # its uvicorn workers go with it
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


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """One server for the module (an MLflow server costs seconds to start on 2 cores), set up as on
    a cluster: clients talk to the server only, and the server keeps the files in an S3 bucket (a
    moto server on loopback). Yields the server's URL, an S3 client, and the server's root."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is needed for the S3 test")
    boto3 = pytest.importorskip("boto3")
    root = tmp_path_factory.mktemp("registry-server")
    s3 = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    s3.start()
    try:
        host, port = s3.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **keys)
        client.create_bucket(Bucket="models")
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "MLFLOW_S3_ENDPOINT_URL": endpoint,  # the server's S3 client talks to moto
        }
        with running_server(root, "registry.artifact_root=s3://models/registry", env=env) as url:
            yield url, client, root
    finally:
        s3.stop()


def bucket_keys(client) -> set[str]:
    listed = client.list_objects_v2(Bucket="models", Prefix="registry/")
    return {o["Key"] for o in listed.get("Contents", [])}


def artifact_and_client(url: str, tmp_path: Path, **files: bytes) -> tuple[Path, RegistrySettings]:
    """A BM25 artifact dir (config.json plus ``files``) and a client's settings as on a cluster node:
    the tracking URI names the server, the root is the client's own."""
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "config.json").write_text(json.dumps({"method": "bm25"}))
    for name, data in files.items():
        (artifact / name).write_bytes(data)
    return artifact, RegistrySettings(tracking_uri=url, root=str(tmp_path / "client"))


def test_versions_through_the_server_resolve_by_download(s3_server, tmp_path):
    url, client, root = s3_server
    artifact, settings = artifact_and_client(url, tmp_path, **{"index.npy": b"\x93NUMPY"})
    registry = ModelRegistry(settings)
    before = bucket_keys(client)
    version = registry.log_version("served", str(artifact), metrics={"valid/ndcg_at_3": 0.7})
    registry.promote("served", version.number)
    assert version.source.startswith("mlflow-artifacts:")  # the server proxies the artifact store
    local = resolve("models:/served@champion", settings)
    assert local == str(tmp_path / "client" / "versions" / "served" / "v1")
    assert not os.path.islink(local)  # downloaded, not linked
    assert sorted(os.listdir(local)) == ["config.json", "index.npy"]
    assert (root / "store" / "mlflow.db").exists()  # the server's sqlite store
    # The server's artifact store (the bucket) holds the files.
    assert sorted(k.rsplit("/", 1)[1] for k in bucket_keys(client) - before) == ["config.json", "index.npy"]


def test_a_server_keeps_its_artifacts_on_s3_only(s3_server, tmp_path):
    url, client, root = s3_server
    artifact, settings = artifact_and_client(url, tmp_path)
    registry = ModelRegistry(settings)
    before = bucket_keys(client)
    registry.promote("s3model", registry.log_version("s3model", str(artifact)).number)
    local = resolve("models:/s3model@champion", settings)
    assert os.listdir(local) == ["config.json"]
    (new,) = bucket_keys(client) - before  # the version's one file, in the bucket
    assert new.endswith("/artifacts/model/config.json"), new
    assert not (root / "store" / "artifacts").exists()  # nothing kept on the server's disk


def test_a_client_side_tracking_uri_is_refused_as_the_servers_store(tmp_path, monkeypatch):
    # MLFLOW_TRACKING_URI, set for the clients in a pod, named the server itself as its store:
    # mlflow started and failed on every request.
    from typer.testing import CliRunner

    from workflows.cli import app

    started = []
    monkeypatch.setattr(os, "execv", lambda *argv: started.append(argv))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://toolscout-mlflow:5000")
    result = CliRunner().invoke(app, ["registry", "server", f"registry.root={tmp_path}"])
    assert result.exit_code == 1 and started == []
    assert "needs a database as its store" in " ".join(result.output.split())
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert CliRunner().invoke(app, ["registry", "server", f"registry.root={tmp_path}"]).exit_code == 0
    assert started and "sqlite:///" in " ".join(started[0][1])
    # A store the embedded registry wrote: its versions' files are local paths, readable on this
    # machine only; the server says so, naming the models, rather than failing clients later.
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"method": "bm25"}')
    registry = ModelRegistry(RegistrySettings(root=str(tmp_path)))
    registry.log_version("tools", str(model))
    # A model logged through a server before (its files proxied, mlflow-artifacts:/) is not named.
    registry.client.create_experiment("proxied", artifact_location="mlflow-artifacts:/proxied")
    registry.client.create_registered_model("proxied")
    result = CliRunner().invoke(app, ["registry", "server", f"registry.root={tmp_path}"])
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and "warning: tools: versions logged before this server" in said
