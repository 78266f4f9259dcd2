"""Ray Train's local mode against one worker actor, for a small stage.

The same dense contrastive stage (the tiny test encoder, 4 epochs on the 300-query generated
quickstart) through :func:`components.training.runner.run_stage`, alternately with
``num_workers: 1`` (a controller and a worker actor) and ``num_workers: 0`` (Ray Train's local
mode: the loop in this process), ``--repeats`` times each in one Ray session. Reports the median
wall seconds of each, the ratio to the worker run, and the valid nDCG@3 of each (which must agree:
local mode trains the same weights).

    python benchmarks/train_local_mode.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import ray
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tests/conftest.py's constants (it imports nothing heavier than pytest).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from conftest import TINY_ENCODER

from components.data import open_dataset
from components.data.quickstart import generate_quickstart
from components.methods.dense.method import DenseMethod
from components.training.spec import RunSpec
from workflows.ray_env import init_ray
from workflows.report import md_table, write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "train_local_mode.json")
# The stage the suite's session dense fixture trains (tests/conftest.py: trained_dense), which is
# what local mode saves the tests from starting workers for.
ENCODER = {**TINY_ENCODER, "ngram_buckets": 4096}
PARAMS = {"encoder": ENCODER, "epochs": 4, "batch_size": 32, "lr": 3e-3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    init_ray({"num_cpus": 2, "progress_bars": False})
    import transformers

    transformers.logging.set_verbosity_error()
    work = tempfile.mkdtemp(prefix="local-mode-")
    generate_quickstart(os.path.join(work, "data"), seed=3, n_queries=300, n_neg=20)
    data = open_dataset(os.path.join(work, "data"))
    seconds: dict[int, list[float]] = {1: [], 0: []}
    scores: dict[int, set[float]] = {1: set(), 0: set()}
    for i in range(args.repeats):
        for workers in (1, 0):
            run = RunSpec(
                name=f"r{i}-w{workers}",
                num_workers=workers,
                storage_path=os.path.join(work, "store"),
                local_dir=os.path.join(work, "local"),
            )
            started = time.perf_counter()
            report = DenseMethod(**PARAMS).fit("contrastive", data, run)
            seconds[workers].append(time.perf_counter() - started)
            scores[workers].add(round(float(report["valid_ndcg@3"]), 6))
            print(f"repeat {i} workers {workers}: {seconds[workers][-1]:.2f} s", flush=True)
    base = statistics.median(seconds[1])
    config = {"dataset": data.name, "repeats": args.repeats, **PARAMS}
    names = {1: "ray train, 1 worker actor", 0: "ray train local mode (num_workers 0)"}
    rows = [
        {
            "method": names[w],
            "config": {**config, "num_workers": w},
            "split": "train",
            "metrics": {
                "seconds_median": statistics.median(seconds[w]),
                "seconds_min": min(seconds[w]),
                "seconds_max": max(seconds[w]),
                "valid_ndcg@3": sorted(scores[w])[0],
                "distinct_valid_ndcg@3": len(scores[w]),
                "ratio": statistics.median(seconds[w]) / base,
            },
        }
        for w in (1, 0)
    ]
    report = {
        "dataset": data.name,
        "results": rows,
        "notes": f"2 CPU cores, Ray {ray.__version__}, torch {torch.__version__}; one Ray session, the "
        f"two modes alternated {args.repeats} times; a whole `fit` of the stage (initial model, run, "
        "best checkpoint); ratio = median seconds / median seconds of the worker run.\n",
    }
    cells = [
        [
            r["method"],
            f"{r['metrics']['seconds_median']:.2f}",
            f"{r['metrics']['seconds_min']:.2f}–{r['metrics']['seconds_max']:.2f}",
            f"{r['metrics']['valid_ndcg@3']:.4f}",
            f"{r['metrics']['ratio']:.3f}",
        ]
        for r in rows
    ]
    table = md_table(["run", "median s", "range s", "valid ndcg@3", "ratio"], cells)
    write_report(
        report,
        args.out,
        title="Ray Train local mode vs a worker actor",
        plot=False,
        table=table,
    )


if __name__ == "__main__":
    main()
