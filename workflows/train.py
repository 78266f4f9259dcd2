"""``toolscout train``: run a method's stages in order on Ray Train, index, save a versioned artifact.

Each stage is one ``TorchTrainer`` run named ``<run_name>-<stage>`` under ``train.storage_path``;
starting ``toolscout train`` again with the same ``train.run_name`` resumes those runs from their
last checkpoints. The trained method lands in ``<train.output>/<method>/vNNNN`` and
``<train.output>/<method>/LATEST`` names the newest version (what evaluate and serving load).
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from components import methods
from components.data import Dataset, dataset_from_config
from components.data.registry import promote, reserve_version
from components.methods.base import Method, RunSpec


def run_spec(cfg: dict[str, Any], name: str, scope: str | None = None) -> RunSpec:
    """The ``train`` section of a config as a :class:`RunSpec`.

    Args:
        name: The run's name when ``train.run_name`` is not set.
        scope: What tells this run apart inside one job (a bench entry and grid combo): appended
            to ``train.run_name``, so that two trainings never share, and resume, one run.
    """
    t = cfg.get("train", {})
    storage = t.get("storage_path", "runs/train")
    if t.get("run_name"):
        name = f"{t['run_name']}-{scope}" if scope else t["run_name"]
    return RunSpec(
        name=name,
        storage_path=storage if "://" in storage else os.path.abspath(storage),
        num_workers=int(t.get("num_workers", 1)),
        use_gpu=bool(t.get("use_gpu", False)),
        resources_per_worker=dict(t.get("resources_per_worker") or {}),
        max_failures=int(t.get("max_failures", 0)),
        keep_checkpoints=t.get("keep_checkpoints"),
        local_dir=os.path.abspath(t.get("local_dir", "runs/checkpoints")),
        env={k: str(v) for k, v in (t.get("env") or {}).items()},
        storage_options=dict(t.get("storage_options") or {}),
        seed=int(t.get("seed", 0)),
        deterministic=bool(t.get("deterministic", True)),
    )


def fit_method(method: Method, dataset: Dataset, run: RunSpec) -> dict[str, Any]:
    """Run every stage of ``method`` in order, then index the corpus; returns per-stage metrics.

    A method carries its own state from one stage to the next (each stage starts from the
    previous stage's best checkpoint).
    """
    report: dict[str, Any] = {"stages": {}}
    started = time.perf_counter()
    for stage in method.stages:
        report["stages"][stage] = method.fit(stage, dataset, run)
    method.index(dataset.corpus)
    report["train_seconds"] = time.perf_counter() - started
    return report


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train the method named in ``cfg["method"]`` on ``cfg["data"]["path"]`` and save a new version.

    Returns:
        ``{"artifact": version dir, "stages": {...}, "train_seconds": ...}``.
    """
    mcfg = cfg["method"]
    dataset = dataset_from_config(cfg)
    method = methods.build(mcfg["name"], mcfg.get("params"))
    # Reserved before training: it must be this run's alone. The default run name adds a time
    # stamp, since a failed run frees its version number but leaves its checkpoints in storage;
    # resuming is what an explicit train.run_name is for.
    artifact = reserve_version(os.path.join(cfg["train"]["output"], mcfg["name"]))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        name = f"{dataset.name}-{mcfg['name']}-{os.path.basename(artifact)}-{stamp}"
        report = fit_method(method, dataset, run_spec(cfg, name))
        method.save(artifact)
    except BaseException:
        shutil.rmtree(artifact, ignore_errors=True)  # no half-written or empty version left behind
        raise
    promote(artifact)
    return {"artifact": artifact, **report}
