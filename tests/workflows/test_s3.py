"""Reading a dataset and writing artifacts through s3fs, against a moto S3 server on 127.0.0.1."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import write_tiny_dataset

from components.data.loader import SourceFile, load_dataset
from components.data.prepared import load_prepared
from components.data.rejects import RejectLog
from components.data.splits import prepare_splits
from workflows.preprocess import preprocess

moto_server = pytest.importorskip("moto.server", reason="moto[server] is needed for the S3 tests")
boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def s3_endpoint():
    """A moto S3 server bound to 127.0.0.1 on a free port, stopped after the module.

    Its credentials are never put in the environment: the code under test must carry them in
    ``storage_options`` to every process (a Ray started after an env var was set would inherit it,
    and a dropped option would go unnoticed)."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def client(endpoint: str):
    """A boto3 S3 client of the moto server, its credentials given here only."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


def options(endpoint: str) -> dict:
    """The storage_options that reach the moto server (s3fs's settings)."""
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


def upload(endpoint: str, bucket: str, root: Path, prefix: str) -> None:
    s3 = client(endpoint)
    s3.create_bucket(Bucket=bucket)
    for path in root.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")


def test_load_dataset_from_s3_equals_local(s3_endpoint, tmp_path):
    local = write_tiny_dataset(tmp_path / "d", bad_rows=True)
    upload(s3_endpoint, "data", local, "tiny")
    opts = options(s3_endpoint)
    remote = load_dataset("s3://data/tiny", storage_options=opts)
    expected = load_dataset(str(local))
    assert remote.corpus == expected.corpus
    assert remote.qrels == expected.qrels
    assert remote.neg_queries == expected.neg_queries
    assert remote.name == "tiny"


def test_preprocess_s3_to_s3(ray_session, s3_endpoint, tmp_path):
    local = write_tiny_dataset(tmp_path / "d")
    upload(s3_endpoint, "jobs", local, "in")
    # Credentials travel in storage_options: Ray workers started before this test never saw the env vars.
    opts = options(s3_endpoint)
    cfg = {
        "data": {"path": "s3://jobs/in", "storage_options": opts},
        "preprocess": {"output": "s3://jobs/out", "parallelism": 2},
    }
    manifest = preprocess(cfg)
    assert manifest["counts"]["tools"] == 4
    assert "testing" not in json.dumps(manifest)  # credentials never reach the manifest
    got = load_prepared("s3://jobs/out", storage_options=opts)
    expected = prepare_splits(load_dataset(str(local)))
    assert got.qrels == expected.qrels and got.corpus == expected.corpus
    # Again, into an output whose name holds pattern characters, twice: the second run replaces
    # the first's tables (Ray's overwrite emptied them through fsspec's glob-reading rm, and failed).
    cfg["preprocess"]["output"] = "s3://jobs/exp[1]"
    for _ in range(2):
        preprocess(cfg)
    again = load_prepared("s3://jobs/exp[1]", storage_options=opts)
    assert again.qrels == expected.qrels and again.corpus == expected.corpus


def test_ray_train_reads_its_inputs_from_and_checkpoints_to_s3(
    ray_session, s3_endpoint, small_quickstart, tmp_path
):
    import shutil

    import ray
    from conftest import TINY_ENCODER

    from components.data import io
    from components.methods.dense.method import DenseMethod
    from components.training import checkpoints, inputs
    from components.training.runner import run_stage
    from components.training.spec import RunSpec

    client(s3_endpoint).create_bucket(Bucket="train")
    # The options travel with the filesystem object to Ray's controller and workers, whose
    # environment was fixed when Ray started: they must not depend on this process's variables.
    opts = options(s3_endpoint)
    local = str(tmp_path / "local")
    # Two workers (DDP over gloo, each on its shard of the batches): the run that shows Ray Train
    # with more than one worker trains as one process does (see the local-mode run below).
    run = RunSpec(
        name="s3run", storage_path="s3://train/runs", local_dir=local, storage_options=opts, num_workers=2
    )
    method = DenseMethod(encoder=TINY_ENCODER, epochs=4, batch_size=32, lr=2e-3)
    init = tmp_path / "init"
    method.initial_model(small_quickstart, str(init), seed=0)
    files = sorted(p.name for p in init.iterdir())
    source = inputs.share(str(init), run, "s3run-init")
    assert source == "s3://train/runs/inputs/s3run-init"
    fs = io.filesystem(source, opts)
    assert sorted(os.path.basename(p) for p in fs.ls(source, detail=False)) == files
    # A GPU worker node cannot read the driver's disk: with the local copy gone, training still runs
    # (the worker downloads the input itself; nothing on the driver fetched it before).
    shutil.rmtree(init)
    result = run_stage(method.stage_config(source, ray.put(small_quickstart)), run)
    stored = checkpoints.persisted("s3://train/runs", "s3run-contrastive", opts)
    assert [state["epoch"] for _, state in stored] == [0, 1, 2, 3]
    assert all(path.startswith("s3://train/runs/s3run-contrastive/checkpoint_") for path, _ in stored)
    assert result.model_uri.startswith("s3://train/runs/s3run-contrastive/checkpoint_")
    assert result.model_dir.startswith(local) and os.path.isdir(result.model_dir)
    assert [h["epoch"] for h in result.history] == [0, 1, 2, 3]
    assert sorted(os.listdir(io.fetch(source, opts))) == files
    # Ray Train's local mode persists its checkpoints to the same bucket itself (the whole
    # checkpoint, model directory included), and the runner reads the best one back from there.
    local_run = replace(run, name="s3local", num_workers=0)
    again = run_stage(method.stage_config(source, small_quickstart), local_run)
    kept = checkpoints.persisted("s3://train/runs", "s3local-contrastive", opts)
    assert [state["epoch"] for _, state in kept] == [0, 1, 2, 3]
    assert again.model_uri.startswith("s3://train/runs/s3local-contrastive/checkpoint_local_epoch")
    assert sorted(os.listdir(again.model_dir)) == sorted(os.listdir(result.model_dir))
    # Two gloo workers train as one process does, to the noise of how the batches are cut.
    one, two = again.metrics["valid_ndcg@3"], result.metrics["valid_ndcg@3"]
    assert two == pytest.approx(one, abs=0.1), (one, two)
    assert two > 0.2, (one, two)  # an untrained model scores about 0.1 here


def test_stage_inputs_pass_through_or_are_copied_into_the_run_storage(tmp_path):
    from components.training import inputs
    from components.training.spec import RunSpec

    # Hub names and URLs pass through; with local storage a directory outside it is copied in.
    s3_run = RunSpec(name="r", storage_path="s3://train/runs")
    assert inputs.share("meta-llama/Meta-Llama-3-8B", s3_run, "n") == "meta-llama/Meta-Llama-3-8B"
    source = "s3://train/runs/inputs/r-init"
    assert inputs.share(source, s3_run, "n") == source
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w").write_text("x")
    local_run = RunSpec(name="x", storage_path=str(tmp_path / "store"))
    copied = inputs.share(str(tmp_path / "model"), local_run, "n")
    assert copied == str(tmp_path / "store" / "inputs" / "n") and os.listdir(copied) == ["w"]
    assert inputs.share(copied, local_run, "m") == copied  # already inside the storage: as is


def test_retrain_increment_is_read_from_s3(ray_session, s3_endpoint, tmp_path):
    """An increment on s3:// goes through the same Ray Data validation as a local one."""
    from conftest import QUERIES

    from components.data.rejects import RejectLog
    from workflows.retrain.increment import merge, read_increment

    base = load_dataset(str(write_tiny_dataset(tmp_path / "base")))
    inc = tmp_path / "inc"
    (inc / "qrels").mkdir(parents=True)
    (inc / "corpus.jsonl").write_text(
        json.dumps({"_id": "9", "title": "", "text": "currency converter"}) + "\n"
    )
    new = {"n1": "convert 20 euros to dollars", "n2": "exchange rate yen"}
    rows = [json.dumps({"_id": q, "text": t}) for q, t in new.items()]
    rows.append(json.dumps({"_id": next(iter(QUERIES)), "text": "reused id"}))
    (inc / "queries.jsonl").write_text("\n".join(rows) + "\n")
    (inc / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nn1\t9\t1\nn2\t9\t1\nn2\tzzz\t1\n")
    upload(s3_endpoint, "increments", inc, "day1")
    opts = options(s3_endpoint)
    log = RejectLog()
    got = read_increment("s3://increments/day1", base, log, opts)
    assert got.counts(base) == {
        "new_tools": 1, "updated_tools": 0, "new_queries": 2, "train_judged_queries": 2, "neg_queries": 0
    }  # fmt: skip
    assert sorted((r.file, r.line) for r in log.rejects) == [("qrels/train.tsv", 4), ("queries.jsonl", 3)]
    merged = merge(base, got)
    assert merged.qrels["train"]["n1"] == {"9": 1} and "9" in merged.corpus


def test_a_sweep_keeps_its_trials_on_s3_and_restores_from_there(ray_session, s3_endpoint, tmp_path):
    """``tune.storage_path: s3://...``: trials, the experiment state and the report live in the
    bucket, and running the same sweep again restores it from there instead of re-running trials."""
    from components.config import merge
    from components.data import io
    from components.data.quickstart import generate_quickstart
    from workflows.cli_config import packaged_config
    from workflows.tune.sweep import tune_sweep

    client(s3_endpoint).create_bucket(Bucket="sweeps")
    opts = options(s3_endpoint)
    data = tmp_path / "data"
    generate_quickstart(str(data), seed=3, n_queries=300, n_neg=20)
    cfg = merge(
        packaged_config("default"),
        {
            "data": {"path": str(data)},
            "method": {"name": "bm25", "params": {"profile": "default"}},
            "train": {"storage_path": "s3://sweeps/train", "storage_options": opts},
            "tune": {
                "name": "bm",
                "storage_path": "s3://sweeps/tune",
                "search": "random",
                "num_samples": 1,
                "max_concurrent": 1,
                "space": {"method.params.k1": {"grid_search": [0.9, 1.5]}},
            },
        },
    )
    report = tune_sweep(cfg)
    assert [t["status"] for t in report["trials"]] == ["completed", "completed"]
    fs = io.filesystem("s3://sweeps/tune/bm", opts)
    stored = fs.find("sweeps/tune/bm")
    results = [p for p in stored if p.endswith("/result.json")]
    assert len(results) == 2 and any("experiment_state" in p for p in stored)
    assert "sweeps/tune/bm/results.json" in stored  # tune.out defaults to the sweep's own prefix
    assert json.loads(fs.cat("sweeps/tune/bm/results.json"))["best"] == report["best"]
    again = tune_sweep(cfg)  # the same sweep: restored from S3, nothing trains again
    assert sorted(t["trial_id"] for t in again["trials"]) == sorted(t["trial_id"] for t in report["trials"])
    assert all(len(fs.cat(p).decode().splitlines()) == 1 for p in results)  # one report each: not re-run


def test_a_path_with_pattern_characters_is_only_itself(s3_endpoint, tmp_path):
    from components.data import io

    s3 = client(s3_endpoint)
    s3.create_bucket(Bucket="names")
    for key in ("exp[1]/w.bin", "exp1/w.bin", "model[a]/w.bin", "modela/w.bin"):
        s3.put_object(Bucket="names", Key=key, Body=key.encode())
    opts = options(s3_endpoint)
    # fsspec's rm and get read [ ] as a pattern: removing exp[1] deleted exp1 and left exp[1].
    io.remove("s3://names/exp[1]", opts)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="names")["Contents"]}
    assert keys == {"exp1/w.bin", "model[a]/w.bin", "modela/w.bin"}
    fetched = io.fetch("s3://names/model[a]", opts)
    assert (Path(fetched) / "w.bin").read_bytes() == b"model[a]/w.bin"
    # Uploaded from a local source of such a name, the source is itself too, sub-folders kept.
    for name in ("run[1]", "run1"):
        (tmp_path / name / "model").mkdir(parents=True)
        (tmp_path / name / "model" / "w.bin").write_bytes(name.encode())
    io.put_dir(str(tmp_path / "run[1]"), "s3://names/up[1]", opts)
    got = s3.get_object(Bucket="names", Key="up[1]/model/w.bin")["Body"].read()
    assert got == b"run[1]" and not any(
        k.startswith("up1") for k in {o["Key"] for o in s3.list_objects_v2(Bucket="names")["Contents"]}
    )


def test_checkpoints_written_by_other_processes_are_seen_after_an_earlier_listing(s3_endpoint):
    from components.training import checkpoints

    s3 = client(s3_endpoint)
    s3.create_bucket(Bucket="ckpt")
    s3.put_object(Bucket="ckpt", Key="runs/r/run_meta.json", Body=b"{}")  # the run exists, no checkpoint
    opts = options(s3_endpoint)
    assert checkpoints.persisted("s3://ckpt/runs", "r", opts) == []  # a resume's first look
    # A Ray Train worker (another process, another client) writes epoch 0's checkpoint meanwhile.
    import torch
    from safetensors.torch import save

    for name in checkpoints.REQUIRED[:-2]:  # whole files: a checkpoint cut short is passed over
        body = save({"w": torch.ones(2)}) if name.endswith(".safetensors") else b"{}"
        s3.put_object(Bucket="ckpt", Key=f"runs/r/checkpoint_0/{name}", Body=body)
    state = json.dumps({"epoch": 0, "history": []}).encode()
    s3.put_object(Bucket="ckpt", Key=f"runs/r/checkpoint_0/{checkpoints.TRAINER_STATE}", Body=state)
    s3.put_object(Bucket="ckpt", Key="runs/r/checkpoint_0/model/config.json", Body=b"{}")
    # The process's shared s3fs kept the first listing: the run's result would have been the old one.
    (found,) = checkpoints.persisted("s3://ckpt/runs", "r", opts)
    assert found[0].endswith("checkpoint_0") and found[1]["epoch"] == 0


def test_a_directory_where_a_file_belongs_is_said_to_be_one(s3_endpoint):
    from components.data import DatasetError

    s3 = client(s3_endpoint)
    s3.create_bucket(Bucket="parts")
    s3.put_object(Bucket="parts", Key="ds/corpus.jsonl/part-0", Body=b'{"_id": "t", "text": "x"}\n')
    s3.put_object(Bucket="parts", Key="ds/queries.jsonl", Body=b'{"_id": "q", "text": "y"}\n')
    s3.put_object(Bucket="parts", Key="ds/qrels/train.tsv", Body=b"q\tt\t1\n")
    # As Spark or Ray write a "file": read as an object it is empty, and was reported as an empty file.
    with pytest.raises(DatasetError, match=r"corpus\.jsonl: is a directory"):
        load_dataset("s3://parts/ds", storage_options=options(s3_endpoint))
    # The same on Ray Data (toolscout preprocess), before any file is read.
    from workflows.ray_ingest import ingest

    sources = [SourceFile("corpus.jsonl", "records"), SourceFile("queries.jsonl", "records")]
    with pytest.raises(DatasetError, match=r"corpus\.jsonl: is a directory"):
        ingest("s3://parts/ds", sources, RejectLog(), options(s3_endpoint))


def test_ingest_mcp_writes_its_catalog_to_s3(s3_endpoint, tmp_path, monkeypatch):
    # --out was typed as a local Path: s3://b/c became ./s3:/b/c and the command exited 0.
    from test_ingest_mcp import ingest, stdio_server

    s3 = client(s3_endpoint)
    s3.create_bucket(Bucket="catalog")
    # The CLI takes no storage options: s3fs reads the environment, as the AWS tools do.
    for key, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    result = ingest(tmp_path, stdio_server(tmp_path, ["forecast"]), out="s3://catalog/tools")
    assert result.exit_code == 0, result.output
    body = s3.get_object(Bucket="catalog", Key="tools/corpus.jsonl")["Body"].read().decode()
    assert [json.loads(line)["_id"] for line in body.splitlines()] == ["weather-desk/forecast"]
    assert not (tmp_path / "s3:").exists()
