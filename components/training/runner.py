"""Run one method stage as one Ray Train ``TorchTrainer`` run and return its best checkpoint.

This is the one training path: every stage of every method (and the serving selector's LM) is a
:class:`components.training.spec.StageConfig` run here. Scaling (workers, GPUs, resources per
worker), failure handling and checkpoint selection come from the ``train`` section of the config
(:class:`components.training.spec.RunSpec`). A run started again with the same name and storage
path resumes from its latest checkpoint. ``num_workers: 0`` is Ray Train's local mode: the same
loop in this process, without worker actors, its checkpoints persisted to the same storage.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from components.data import io
from components.training import checkpoints
from components.training.checkpoints import STAGE_OUTPUT
from components.training.loop import train_loop_per_worker
from components.training.resume import check_resumable
from components.training.spec import RunSpec, StageConfig, pack
from components.training.tune_reports import tune_callbacks


@dataclass
class StageResult:
    """What a stage run produced."""

    checkpoint_dir: str  # local directory of the best checkpoint
    model_dir: str  # the task's reloadable model inside it
    metrics: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    model_uri: str = ""  # the model where it is stored (an s3:// URL with remote storage)


def worker_env(run: RunSpec) -> dict[str, str]:
    """Environment of the training workers: ``run.env``, plus what deterministic cuBLAS needs on GPUs
    (it must be set before CUDA starts, so it cannot wait for the loop)."""
    env = dict(run.env)
    if run.deterministic and run.use_gpu:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return env


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in this process for the block (local mode has no workers to hand it to)."""
    previous = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_stage(stage: StageConfig, run: RunSpec) -> StageResult:
    """Train one stage with ``TorchTrainer``; the best checkpoint is chosen by ``stage.score`` (max).

    Args:
        stage: What to train (the task's import string, hyper-parameters, inputs).
        run: Scaling, storage and failure settings; they fill the stage's run name, storage,
            seed, device and precision (:meth:`StageConfig.for_run`).
    """
    started = time.perf_counter()
    config = stage.for_run(run)
    name, score = config.run_name, config.score
    previous = checkpoints.latest(run.storage_path, name, run.storage_options)
    if previous is not None:
        # Checked here, once, before any worker starts: a clear error instead of a failed run.
        check_resumable(previous[1], config)
    env = worker_env(run)
    if config.local and (run.report_to_tune or config.chaos is not None):
        # Ray refuses ray.train's APIs inside a Tune function, and a planned worker failure would
        # kill this process.
        raise ValueError(
            "train.num_workers: 0 (Ray Train's local mode) runs the stage in this process: it cannot "
            "run inside a Ray Tune trial or take a planned worker failure; use num_workers >= 1"
        )
    trainer = TorchTrainer(
        train_loop_per_worker,
        # Ray Train takes a dict here; it carries the one typed object (its params as bytes).
        train_loop_config=pack(config),
        torch_config=TorchConfig(backend="nccl" if run.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=run.num_workers,
            use_gpu=run.use_gpu,
            resources_per_worker=run.resources_per_worker or None,
        ),
        run_config=RunConfig(
            name=name,
            # With an explicit filesystem Ray wants the path inside it: "bucket/prefix", no scheme.
            storage_path=run.storage_path.split("://", 1)[1]
            if io.is_remote(run.storage_path)
            else run.storage_path,
            storage_filesystem=io.arrow_filesystem(run.storage_path, run.storage_options),
            failure_config=FailureConfig(max_failures=run.max_failures),
            callbacks=tune_callbacks(run),
            worker_runtime_env={"env_vars": env} if env else None,
            checkpoint_config=CheckpointConfig(
                num_to_keep=run.keep_checkpoints,
                checkpoint_score_attribute=score,
                checkpoint_score_order="max",
            ),
        ),
    )
    if run.use_gpu and torch.cuda.is_available():
        # This process may share the GPU with the stage's worker and hold blocks in its caching
        # allocator from its own work between stages (an LM generating rewrites or samples).
        torch.cuda.empty_cache()
    with environment(env if config.local else {}):
        trainer.fit()  # raises (Train V2: TrainingFailedError) when the run fails
    # Choose from what is persisted, not only from what the controller registered (see checkpoints).
    found = checkpoints.persisted(run.storage_path, name, run.storage_options)
    if config.local and run.keep_checkpoints is not None:
        found = checkpoints.prune(found, run.keep_checkpoints, score, run.storage_options)
    best_path, best_state = checkpoints.best_of(found, score)
    local = best_path
    if io.is_remote(run.storage_path):
        local = os.path.join(run.local_dir, name, os.path.basename(best_path.rstrip("/")))
        # fsspec's get into an existing directory nests the copy inside it: start clean.
        shutil.rmtree(local, ignore_errors=True)
        io.filesystem(best_path, run.storage_options).get(best_path, local, recursive=True)
    history = found[-1][1]["history"]  # the last epoch's state holds every epoch's metrics
    metrics = best_state["history"][-1]
    return StageResult(
        checkpoint_dir=local,
        model_dir=os.path.join(local, STAGE_OUTPUT),
        model_uri=io.join(best_path, STAGE_OUTPUT),
        metrics=dict(metrics),
        history=history,
        seconds=time.perf_counter() - started,
    )
