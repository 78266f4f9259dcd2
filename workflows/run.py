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


def quickstart_data(cfg: dict[str, Any]) -> str:
    """The dataset directory to run on: ``data.path`` if set, else generated under the workdir.

    Raises:
        FileNotFoundError: ``data.path`` is set but holds no ``corpus.jsonl``.
    """
    rcfg = cfg["run"]
    work = os.path.abspath(rcfg["workdir"])
    given = cfg["data"].get("path")
    data_dir = given or os.path.join(work, "data")
    if given and not io.exists(io.join(given, "corpus.jsonl")):
        # A mistyped path must not turn into a run on generated data reported as the user's.
        raise FileNotFoundError(
            f"data.path {given!r} has no corpus.jsonl; leave data.path unset for quickstart data"
        )
    if not io.exists(io.join(data_dir, "corpus.jsonl")):
        seed, n_queries, n_neg = int(rcfg.get("seed", 0)), int(rcfg["n_queries"]), int(rcfg["n_neg"])
        counts = generate_quickstart(data_dir, seed=seed, n_queries=n_queries, n_neg=n_neg)
        print(f"generated quickstart data in {data_dir}: {counts}")
    return data_dir


def run(cfg: dict[str, Any], data_dir: str | None = None) -> dict[str, Any]:
    """Run the whole pipeline under ``cfg["run"]["workdir"]``; returns the evaluation report.

    Trains every method in ``run.methods`` (BM25 indexes; dense and MassTool run Ray Train
    stages) and evaluates each on ``evaluate.splits``.

    Args:
        data_dir: What :func:`quickstart_data` returned, if the caller already resolved it.
    """
    rcfg = cfg["run"]
    work = os.path.abspath(rcfg["workdir"])
    data_dir = data_dir or quickstart_data(cfg)
    prepared = os.path.join(work, "prepared")
    cfg = merge(
        cfg,
        {
            "data": {"path": data_dir},
            "preprocess": {"output": prepared},
            "train": {
                "output": os.path.join(work, "models"),
                "storage_path": os.path.join(work, "train"),
                "local_dir": os.path.join(work, "checkpoints"),
            },
        },
    )
    manifest = preprocess(cfg)
    print(f"preprocessed: {manifest['counts']}, rejects: {manifest['rejects']['total']} -> {prepared}")
    cfg = merge(cfg, {"data": {"path": prepared}})
    rows = []
    for name in rcfg.get("methods") or [cfg["method"]["name"]]:
        # Replace (not merge) the method section: each method has its own parameters.
        mcfg = {**cfg, "method": {"name": name, "params": (rcfg.get("params") or {}).get(name, {})}}
        trained = train(mcfg)
        print(f"trained {name} in {trained['train_seconds']:.1f}s -> {trained['artifact']}")
        rows += evaluate(merge(mcfg, {"evaluate": {"artifact": trained["artifact"]}}))["results"]
    report = {"dataset": manifest["dataset"], "results": rows}
    write_report(report, os.path.join(work, "results.json"), title="toolscout quickstart")
    return report
