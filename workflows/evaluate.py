"""``toolscout evaluate``: score a saved artifact on a split and write the metrics table."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from components import methods
from components.data import Dataset, dataset_from_config
from components.methods.base import Method
from components.metrics import DEFAULT_KS, evaluate_retrieval


def score(method: Method, dataset: Dataset, split: str, ks: tuple[int, ...] = DEFAULT_KS) -> dict[str, float]:
    """Retrieve for every query of ``split`` and compute the metrics (plus ``eval_seconds``)."""
    started = time.perf_counter()
    results = method.retrieve(dataset.split_queries(split), max(ks))
    metrics = evaluate_retrieval(dataset.qrels[split], results, ks)
    metrics["eval_seconds"] = time.perf_counter() - started
    return metrics


def evaluate(cfg: dict[str, Any]) -> dict[str, Any]:
    """Evaluate ``cfg["evaluate"]["artifact"]`` on ``cfg["evaluate"]["splits"]``; write JSON if asked.

    The default split is ``valid``: the test split is for final reports only.
    """
    ecfg = cfg.get("evaluate", {})
    artifact = ecfg.get("artifact") or os.path.join(cfg["train"]["output"], cfg["method"]["name"])
    dataset = dataset_from_config(cfg)
    method = methods.load(artifact)
    rows = []
    for split in ecfg.get("splits", ["valid"]):
        rows.append(
            {
                "method": method.name,
                "config": method.config(),
                "split": split,
                "metrics": score(method, dataset, split),
            }
        )
    report = {"dataset": dataset.name, "artifact": artifact, "results": rows}
    if ecfg.get("output"):
        os.makedirs(os.path.dirname(os.path.abspath(ecfg["output"])), exist_ok=True)
        with open(ecfg["output"], "w") as f:
            json.dump(report, f, indent=2)
    return report
