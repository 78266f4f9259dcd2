"""Co-occurrence build: Ray Data (hash-partitioned partial counts) vs single-process scipy.

Both builds start from the same in-memory (basket, tool) arrays and are timed in the same run,
alternating, so machine noise hits both; the table reports medians and their ratio. Every Ray
result is checked equal to the scipy result.

    python benchmarks/cooccurrence.py [--toollens ../shared/datasets/toollens] [--pairs 10000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import ray

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.data.graphs import IdMap, cooccurrence, qrels_pairs
from components.data.loader import load_dataset
from workflows.ray_env import init_ray
from workflows.ray_graphs import pairs_dataset, ray_cooccurrence
from workflows.report import md_table, write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cooccurrence.json")


def synthetic_pairs(n_pairs: int, n_tools: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Baskets of 1–5 tools with Zipf-like tool popularity, about ``n_pairs`` pairs in all."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, n_pairs // 3 + 1)
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), n_pairs) + 1]
    basket = np.repeat(np.arange(len(sizes)), sizes)
    popularity = 1.0 / np.arange(1, n_tools + 1) ** 0.8
    tool = rng.choice(n_tools, size=len(basket), p=popularity / popularity.sum())
    return basket, tool


def naive_groupby(basket: np.ndarray, tool: np.ndarray, n_tools: int) -> None:
    """The slow baseline: one Ray Data group per basket (for reference, small inputs only)."""

    def per_group(g: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t = np.unique(g["tool"])
        a, b = np.meshgrid(t, t)
        return {"row": a.ravel(), "col": b.ravel()}

    ds = pairs_dataset(basket, tool, 8).groupby("basket").map_groups(per_group, batch_format="numpy")
    ds.materialize()


BUILDS = {
    "ray data, sorted input (no shuffle)": {"assume_sorted": True},
    "ray data, hash partition": {"assume_sorted": False},
}


def time_pair(name: str, basket: np.ndarray, tool: np.ndarray, n_tools: int, repeats: int) -> list[dict]:
    """Median seconds of the scipy build and each Ray Data build over alternating runs."""
    times: dict[str, list[float]] = {"scipy (1 process)": [], **{k: [] for k in BUILDS}}
    reference = None
    for kwargs in BUILDS.values():  # warm-up: Ray's worker processes and actors start once per run
        ray_cooccurrence(pairs_dataset(basket[:1000], tool[:1000], 2), n_tools, **kwargs)
    for _ in range(repeats):
        t = time.perf_counter()
        reference = cooccurrence(basket, tool, n_tools)
        times["scipy (1 process)"].append(time.perf_counter() - t)
        for label, kwargs in BUILDS.items():
            t = time.perf_counter()
            built = ray_cooccurrence(pairs_dataset(basket, tool, 8), n_tools, **kwargs)
            times[label].append(time.perf_counter() - t)
            if (built != reference).nnz:
                raise AssertionError(f"{name}: {label} differs from scipy")
    config = {
        "pairs": len(basket),
        "baskets": len(np.unique(basket)),
        "tools": n_tools,
        "repeats": repeats,
    }
    ref = statistics.median(times["scipy (1 process)"])
    rows = []
    for label, values in times.items():
        med = statistics.median(values)
        metrics = {"seconds": med, "ratio": med / ref, "nnz": int(reference.nnz)}
        # The split is what the rows are built from (train, or none for synthetic baskets); which
        # input it is goes in the config.
        split = "train" if name.endswith("-train") else "synthetic"
        row = {"method": label, "config": {**config, "input": name}, "split": split, "metrics": metrics}
        rows.append(row)
        print(f"{name}: {label} {med:.2f}s (ratio {med / ref:.2f})")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toollens", default="../shared/datasets/toollens")
    parser.add_argument("--pairs", type=int, default=10_000_000)
    parser.add_argument("--tools", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    init_ray({"num_cpus": 2, "progress_bars": False})
    rows = []
    if os.path.isdir(args.toollens):
        ds = load_dataset(args.toollens, splits=["train"])
        tools = IdMap.of(ds.corpus)
        basket, tool = qrels_pairs(ds.qrels["train"], IdMap.of(ds.qrels["train"]), tools)
        rows += time_pair("toollens-train", basket, tool, len(tools), args.repeats)
        t = time.perf_counter()
        naive_groupby(basket, tool, len(tools))
        naive = time.perf_counter() - t
        ref = rows[0]["metrics"]["seconds"]  # the scipy row
        print(f"toollens-train: naive groupby {naive:.2f}s, ratio {naive / ref:.0f}")
        rows.append(
            {
                "method": "ray data (naive groupby per basket)",
                "config": rows[0]["config"],
                "split": "train",
                "metrics": {"seconds": naive, "ratio": naive / ref},
            }
        )
    basket, tool = synthetic_pairs(args.pairs, args.tools)
    rows += time_pair(f"synthetic-{len(basket) / 1e6:.1f}M", basket, tool, args.tools, args.repeats)
    report = {
        "dataset": "toollens train pairs + synthetic scale-up",
        "notes": f"2 CPU cores, Ray {ray.__version__}; medians of {args.repeats} alternating runs; "
        "ratio = seconds / scipy seconds (goal ≤ 2 on the 10 M input); one warm-up run first.\n",
        "results": rows,
    }
    write_report_cooc(report, args.out)


def write_report_cooc(report: dict, out: str) -> None:
    """JSON + a markdown table with seconds and ratio columns."""
    rows = [
        [
            r["config"].get("input", r["split"]),
            r["method"],
            f"{r['config']['pairs']:,}",
            f"{r['metrics']['seconds']:.2f}",
            f"{r['metrics'].get('ratio', 1.0):.2f}",
        ]
        for r in report["results"]
    ]
    table = md_table(["input", "method", "pairs", "seconds (median)", "ratio"], rows)
    title = "Co-occurrence build: Ray Data vs single process"
    write_report(report, out, title=title, plot=False, table=table)


if __name__ == "__main__":
    main()
