"""``toolscout run``: the quickstart. Generated data -> preprocess -> train -> evaluate, locally."""

from __future__ import annotations

import os
from typing import Any

from components.config import merge
from components.data import io
from components.data.quickstart import generate_quickstart
from workflows.evaluate import evaluate
from workflows.preprocess import preprocess
from workflows.report import write_report
from workflows.train import train


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run the whole pipeline under ``cfg["run"]["workdir"]``; returns the evaluation report."""
    rcfg = cfg["run"]
    work = os.path.abspath(rcfg["workdir"])
    data_dir = cfg["data"].get("path") or os.path.join(work, "data")
    if not io.exists(os.path.join(data_dir, "corpus.jsonl")):
        counts = generate_quickstart(
            data_dir,
            seed=int(rcfg.get("seed", 0)),
            n_queries=int(rcfg["n_queries"]),
            n_neg=int(rcfg["n_neg"]),
        )
        print(f"generated quickstart data in {data_dir}: {counts}")
    prepared = os.path.join(work, "prepared")
    cfg = merge(
        cfg,
        {
            "data": {"path": data_dir},
            "preprocess": {"output": prepared},
            "train": {"output": os.path.join(work, "models"), "storage_path": os.path.join(work, "train")},
        },
    )
    manifest = preprocess(cfg)
    print(f"preprocessed: {manifest['counts']}, rejects: {manifest['rejects']['total']} -> {prepared}")
    cfg = merge(cfg, {"data": {"path": prepared}})
    trained = train(cfg)
    print(f"trained {cfg['method']['name']} in {trained['train_seconds']:.1f}s -> {trained['artifact']}")
    report = evaluate(cfg)
    write_report(report, os.path.join(work, "results.json"), title="toolscout quickstart")
    return report
