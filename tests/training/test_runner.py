"""Ray Train stage runs: per-epoch checkpoints, best-checkpoint choice, resume, and 2 FSDP workers
(two DDP workers: tests/workflows/test_s3.py, with checkpoints on S3)."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import ray
from conftest import TINY_ENCODER

from components.encoders.bi_encoder import BiEncoder
from components.encoders.retriever import BiEncoderRetriever
from components.methods.dense.method import DenseMethod
from components.metrics import evaluate_retrieval
from components.training.runner import run_stage
from components.training.spec import Chaos, RunSpec


def launch(
    data,
    tmp_path,
    name,
    epochs=3,
    workers=1,
    max_failures=0,
    chaos=None,
    batch_size=32,
    lr=2e-3,
    method_params=None,
    **run_settings,
):
    params = {"encoder": TINY_ENCODER, "epochs": epochs, "batch_size": batch_size, "lr": lr}
    method = DenseMethod(**params, **(method_params or {}))
    run = RunSpec(
        name=name,
        storage_path=str(tmp_path / "store"),
        local_dir=str(tmp_path / "local"),
        num_workers=workers,
        max_failures=max_failures,
        **run_settings,
    )
    init = str(tmp_path / f"{name}-init")
    if not os.path.exists(init):
        method.initial_model(data, init, seed=0)
    log = str(tmp_path / f"{name}.jsonl")
    stage = replace(method.stage_config(init, ray.put(data)), report_log=log, chaos=chaos)
    result = run_stage(stage, run)
    with open(log) as f:
        reports = [json.loads(line) for line in f]
    return result, reports


@pytest.fixture(scope="module")
def runs(ray_session, small_quickstart, tmp_path_factory):
    """Runs several tests read (each Ray Train run on workers costs ~10 s of actor start-up on 2
    cores): ``straight`` trains 4 epochs uninterrupted in Ray Train's local mode (this process),
    keeping one checkpoint; ``split`` trains 2 epochs in local mode, then is started again under the
    same name with 4 epochs on a worker, so it resumes from the last checkpoint the local run
    persisted; that worker is killed when it reaches epoch 3 and Ray restarts it, so the last epoch
    resumes again, from the checkpoint the killed worker persisted."""
    root = tmp_path_factory.mktemp("runs")
    straight = launch(small_quickstart, root, "straight", epochs=4, workers=0, keep_checkpoints=1)
    first_half = launch(small_quickstart, root, "split", epochs=2, workers=0)
    chaos = Chaos(kill_at_epoch=3, marker=str(root / "killed"))
    resumed = launch(small_quickstart, root, "split", epochs=4, max_failures=1, chaos=chaos)
    return {"root": root, "straight": straight, "first_half": first_half, "resumed": resumed, "chaos": chaos}


def test_every_epoch_checkpointed_and_best_selected(runs):
    result, reports = runs["resumed"]  # its last epochs ran on workers: Ray Train persisted them
    assert [r["epoch"] for r in reports] == [0, 1, 2, 3]
    assert [h["epoch"] for h in result.history] == [0, 1, 2, 3]
    assert result.metrics["valid_ndcg@3"] == max(r["valid_ndcg@3"] for r in reports)
    files = sorted(os.listdir(result.checkpoint_dir))
    assert files == [
        "model",
        "model_state.safetensors",
        "optimizer.json",
        "optimizer.safetensors",
        "rng_state.safetensors",
        "trainer_state.json",
    ]
    walked = [f for _, _, fs in os.walk(result.checkpoint_dir) for f in fs]
    assert not any(f.endswith((".pt", ".pkl", ".bin")) for f in walked)


def test_worker_killed_mid_run_resumes_without_losing_or_repeating_epochs(runs):
    result, reports = runs["resumed"]
    assert os.path.exists(runs["chaos"].marker)  # the worker really died once
    assert [r["epoch"] for r in reports] == [0, 1, 2, 3]
    # Epoch 2 ran in the worker that was killed, epoch 3 in the one Ray started in its place.
    killed, replacement = reports[2]["pid"], reports[3]["pid"]
    assert killed != replacement and os.getpid() not in (killed, replacement)
    # Restored from its epoch-2 checkpoint, the new worker trains exactly as an unbroken run does.
    straight, _ = runs["straight"]
    assert [h["valid_ndcg@3"] for h in result.history] == [h["valid_ndcg@3"] for h in straight.history]


def test_resumed_run_trains_exactly_like_an_uninterrupted_one(runs):
    # Same batches, weights, optimizer and RNG state (dropout masks) after each restart: the report
    # log shows epochs 0-1 from the first start and only epochs 2-3 from the later ones.
    straight, _ = runs["straight"]
    resumed, reports = runs["resumed"]
    assert [h["epoch"] for h in runs["first_half"][0].history] == [0, 1]
    assert [r["epoch"] for r in reports] == [0, 1, 2, 3]
    # Epochs 0-1 ran in this process (local mode), 2-3 in worker actors.
    assert [r["pid"] == os.getpid() for r in reports] == [True, True, False, False]
    assert [h["epoch"] for h in resumed.history] == [0, 1, 2, 3]
    assert [h["valid_ndcg@3"] for h in resumed.history] == [h["valid_ndcg@3"] for h in straight.history]
    # The losses agree to float rounding: Ray gives a 1-CPU worker one intra-op thread, this
    # process has two, and the sums are reduced in another order.
    assert [h["train_loss"] for h in resumed.history] == pytest.approx(
        [h["train_loss"] for h in straight.history], rel=1e-6
    )


def test_restarted_run_with_other_settings_is_refused(runs, small_quickstart):
    # Refused on the driver, before any worker starts: the run's checkpoints were made with lr 2e-3.
    with pytest.raises(Exception, match=r"has checkpoints from other settings \(lr, params.lr differ\)"):
        launch(small_quickstart, runs["root"], "split", epochs=4, lr=1e-3)


def test_local_mode_trains_as_a_worker_does_and_keeps_what_ray_would(runs):
    # num_workers 0 is Ray Train's local mode: the loop runs in this process, no worker actor.
    local, reports = runs["straight"]
    worker, _ = runs["resumed"]  # the same 4 epochs, the last two on worker actors
    assert {r["pid"] for r in reports} == {os.getpid()}
    assert [h["valid_ndcg@3"] for h in local.history] == [h["valid_ndcg@3"] for h in worker.history]
    assert local.metrics["valid_ndcg@3"] == worker.metrics["valid_ndcg@3"]
    # keep_checkpoints 1 leaves the best epoch and the newest (what a resume needs), as Ray would.
    epochs = sorted(os.listdir(runs["root"] / "store" / "straight-contrastive"))
    best_epoch = max(range(4), key=lambda e: (local.history[e]["valid_ndcg@3"], -e))
    assert epochs == sorted({f"checkpoint_local_epoch{e:06d}" for e in (best_epoch, 3)})


def test_local_mode_refuses_what_needs_a_worker(ray_session, small_quickstart, tmp_path):
    chaos = Chaos(kill_at_epoch=1, marker=str(tmp_path / "killed"))
    with pytest.raises(ValueError, match="local mode"):
        launch(small_quickstart, tmp_path, "local-chaos", epochs=2, workers=0, chaos=chaos)
    assert not os.path.exists(chaos.marker)


def test_two_fsdp_workers_train_and_checkpoint_the_whole_model(ray_session, small_quickstart, tmp_path):
    # tool_vectors "epoch": each epoch starts by encoding every tool outside the training step,
    # which under FSDP needs the whole parameters gathered first (each rank holds only a shard).
    settings = {"lr": 5e-3, "method_params": {"tool_vectors": "epoch"}}
    launch(small_quickstart, tmp_path, "fsdp", 2, workers=2, parallel_strategy="fsdp", **settings)
    # The run resumes unsharded, here in one process: its checkpoint holds the whole model and the
    # whole optimizer state (rank 0's shard of the AdamW moments failed the first step here). Two
    # more epochs: after one, valid nDCG@3 (0.19-0.24) moved with how the batches were cut.
    two, reports = launch(small_quickstart, tmp_path, "fsdp", 4, workers=0, **settings)
    assert [r["epoch"] for r in reports] == [0, 1, 2, 3] and [h["epoch"] for h in two.history] == [0, 1, 2, 3]
    b = two.metrics["valid_ndcg@3"]
    assert b > 0.2, b  # an untrained model scores about 0.1 here
    # The checkpoint holds the full (unsharded) model: reloaded, it scores what the run reported.
    params = DenseMethod(encoder=TINY_ENCODER, epochs=4, batch_size=32, lr=5e-3).params
    method = BiEncoderRetriever(params, BiEncoder.load(two.model_dir))
    method.index(small_quickstart.corpus)
    queries, best = small_quickstart.split_queries("valid"), 0.0
    for mix in method.variants().values():
        method.mix = mix
        best = max(
            best, evaluate_retrieval(small_quickstart.qrels["valid"], method.retrieve(queries, 10))["ndcg@3"]
        )
    assert best == pytest.approx(b, abs=1e-4)
