"""Per-epoch validation curves of the Ray Train stage runs under a storage path, as a results file.

Every stage of every method is one Ray Train run named ``<run>-<stage>`` under ``train.storage_path``;
Ray keeps each reported epoch's metrics in the run's ``checkpoint_manager_snapshot.json``. This
turns those into the benchmark results format, one row per (stage, epoch) on the ``valid`` split,
so a run that stopped before its report (a lent GPU's time ran out, a killed job) still leaves
its measured curves, and runs on different machines compare on the same valid queries.

    python benchmarks/train_curves.py --runs runs/train --run toollens-toolgen-standard-<stamp> \\
        --label toolgen_smollm2_lora --out benchmarks/results/<name>.json [--about "..."]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from workflows.report import md_table, write_report  # noqa: E402

SNAPSHOT = "checkpoint_manager_snapshot.json"
# Columns of the markdown table, when a stage reports them (the rest stay in the JSON).
SHOWN = (
    "recall@3",
    "ndcg@3",
    "recall@5",
    "memorization_acc",
    "train_loss",
    "epoch_seconds",
    "peak_memory_mb",
)


def stage_runs(runs: str, run: str) -> dict[str, str]:
    """``{stage: snapshot path}`` of the runs named ``<run>-<stage>`` under ``runs``, in the order
    they trained (by their first checkpoint's time-stamped name)."""
    found = {}
    for path in glob.glob(os.path.join(runs, f"{glob.escape(run)}-*", SNAPSHOT)):
        with open(path) as f:
            names = [r["checkpoint_dir_name"] for r in json.load(f)["checkpoint_results"]]
        if names:
            found[os.path.basename(os.path.dirname(path))[len(run) + 1 :]] = (min(names), path)
    if not found:
        raise SystemExit(
            f"{runs}: no {run}-<stage>/{SNAPSHOT} with checkpoints (--run is the name without -<stage>)"
        )
    return {stage: path for stage, (_, path) in sorted(found.items(), key=lambda item: item[1])}


def epoch_rows(label: str, stage: str, snapshot: str) -> list[dict[str, Any]]:
    """One row per reported epoch: the ``valid_`` metrics without their prefix, loss, time, memory."""
    with open(snapshot) as f:
        results = json.load(f)["checkpoint_results"]
    rows = []
    for result in sorted(results, key=lambda r: r["metrics"]["epoch"]):
        reported = result["metrics"]
        metrics = {k.removeprefix("valid_"): float(v) for k, v in reported.items() if k.startswith("valid_")}
        for key in ("train_loss", "epoch_seconds", "peak_memory_mb"):
            if key in reported:
                metrics[key] = float(reported[key])
        rows.append(
            {
                "method": label,
                "config": {"stage": stage, "epoch": int(reported["epoch"]) + 1},
                "split": "valid",
                "metrics": metrics,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Stage, epoch, then the :data:`SHOWN` metrics any row has (blank where a stage has none)."""
    shown = [c for c in SHOWN if any(c in r["metrics"] for r in rows)]

    def cell(name: str, row: dict[str, Any]) -> str:
        value = row["metrics"].get(name)
        if value is None:
            return ""
        return f"{value:.4f}" if ("@" in name or name.endswith("acc")) else f"{value:.1f}"

    body = [[r["config"]["stage"], str(r["config"]["epoch"]), *(cell(c, r) for c in shown)] for r in rows]
    return "\n".join(md_table(["stage", "epoch", *shown], body)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="train.storage_path of the runs")
    parser.add_argument("--run", required=True, help="run name without the -<stage> suffix")
    parser.add_argument("--label", required=True, help="method label of the rows")
    parser.add_argument("--out", required=True, help="results JSON (the .md is written beside it)")
    parser.add_argument("--dataset", default="toollens")
    parser.add_argument("--title", default="")
    parser.add_argument("--about", default="", help="how and where the runs were made, for the notes")
    args = parser.parse_args()
    rows = [
        row
        for stage, path in stage_runs(args.runs, args.run).items()
        for row in epoch_rows(args.label, stage, path)
    ]
    report = {"dataset": args.dataset, "run": args.run, "results": rows, "notes": args.about + "\n"}
    write_report(
        report, args.out, title=args.title or f"Training curves of {args.run}", plot=False, table=table(rows)
    )
    print(table(rows))


if __name__ == "__main__":
    main()
