"""``toolscout train``: run a method's training stages in order, index the corpus, save the artifact."""

from __future__ import annotations

import os
import time
from typing import Any

from components import methods
from components.data import Dataset, open_dataset
from components.methods.base import Method, RunSpec


def run_spec(cfg: dict[str, Any], name: str) -> RunSpec:
    """The ``train`` section of a config as a :class:`RunSpec`."""
    t = cfg.get("train", {})
    return RunSpec(
        name=name,
        storage_path=os.path.abspath(t.get("storage_path", "runs/train")),
        num_workers=int(t.get("num_workers", 1)),
        use_gpu=bool(t.get("use_gpu", False)),
        resources_per_worker=dict(t.get("resources_per_worker") or {}),
        max_failures=int(t.get("max_failures", 0)),
        seed=int(t.get("seed", 0)),
    )


def fit_method(method: Method, dataset: Dataset, run: RunSpec) -> dict[str, Any]:
    """Run every stage of ``method`` in order, then index the corpus; returns per-stage metrics."""
    report: dict[str, Any] = {"stages": {}}
    started = time.perf_counter()
    for stage in method.stages:
        report["stages"][stage] = method.fit(stage, dataset, run)
    method.index(dataset.corpus)
    report["train_seconds"] = time.perf_counter() - started
    return report


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train the method named in ``cfg["method"]`` on ``cfg["data"]["path"]`` and save it.

    Returns:
        ``{"artifact": path, "stages": {...}, "train_seconds": ...}``.
    """
    mcfg = cfg["method"]
    dataset = open_dataset(
        cfg["data"]["path"], cfg.get("splits"), storage_options=cfg["data"].get("storage_options")
    )
    method = methods.build(mcfg["name"], mcfg.get("params"))
    report = fit_method(method, dataset, run_spec(cfg, f"{dataset.name}-{mcfg['name']}"))
    artifact = os.path.join(cfg["train"]["output"], mcfg["name"])
    method.save(artifact)
    return {"artifact": artifact, **report}
