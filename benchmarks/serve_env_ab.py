"""A/B of one Ray setting on Serve latency: paced BM25 detect → retrieve with it on and off.

::

    python -m benchmarks.serve_env_ab --data ../shared/datasets/toollens --rounds 2

Each variant runs in a child process of its own, which starts its own local Ray with the setting
in its environment (Ray reads it at startup, so it cannot be flipped inside one Ray), deploys the
graph as ``toolscout serve`` does (``SERVE_ENV`` plus the variant on top) and runs paced loads
through direct ingress: 8 clients on a fixed schedule at each ``--rates`` (latency from each
request's scheduled send time, as in :mod:`benchmarks.serve_load`), ``--repeats`` runs of
``--seconds`` each. Rounds alternate the order (A B, B A, ...) so that the machine's drift over the
run falls on both variants alike. Reported: every run, and per variant and rate the median over
all its runs, with the ratio of the candidate's median p99 to the baseline's.

The default pair is Ray's metrics collection (``RAY_enable_metrics_collection``): the baseline is
Ray's default (on), the candidate what ``toolscout serve`` sets locally (off).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from components.serving.deploy import METRICS_COLLECTION

RESULTS = "benchmarks/results/serve_env_ab.json"
METRIC_KEYS = ("p50_ms", "p99_ms", "rps")


def child(args: argparse.Namespace) -> None:
    """One variant: start Ray, deploy BM25 detect → retrieve, print the paced runs as JSON."""
    import torch
    from ray import serve

    from benchmarks.serve_load import doors, load, train_artifacts
    from components.data import open_dataset
    from components.serving.deploy import apply_serve_env, deploy_config, serve_config
    from components.serving.models import ensure_calibration
    from workflows.ray_env import init_ray
    from workflows.serve import app_args, read_serve_config

    torch.set_num_threads(1)
    env = apply_serve_env()  # the variant's own value is already in os.environ and wins
    init_ray({"num_cpus": 2, "progress_bars": False, "local": True})
    data = open_dataset(args.data)
    work = os.path.abspath(args.work)
    artifact = train_artifacts(data, work, dense_epochs=1, keys=("bm25",))["bm25"]
    detector_file = os.path.join(work, "detector.json")
    ensure_calibration(artifact, args.data, detector_file)
    bodies = [
        {"query": q, "top_k": 5, "needs_tool_threshold": 0.0} for q in data.split_queries("test").values()
    ]
    port = 18000 + os.getpid() % 1000
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    base = read_serve_config(None)
    flags = {"artifact": artifact, "catalog": os.path.abspath(args.data), "detector_file": detector_file}
    flags["cache_size"] = 0  # repeated loads over the same test queries: answers from the models
    deploy_config(serve_config(app_args(base, flags, []), base))
    urls = doors(f"http://127.0.0.1:{port}")["direct ingress"]
    load(urls, bodies, 8, 3.0, rate=min(args.rates))  # warm-up, not reported
    runs = {
        str(rate): [load(urls, bodies, 8, args.seconds, rate=rate) for _ in range(args.repeats)]
        for rate in args.rates
    }
    serve.shutdown()
    print("RESULT " + json.dumps({"env": env, "runs": runs, "loadavg": os.getloadavg()[0]}))


def run_variant(args: argparse.Namespace, name: str, value: str) -> dict[str, Any]:
    """Run :func:`child` in a fresh process with ``name=value`` and return its parsed result."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.serve_env_ab",
        "--child",
        "--data",
        args.data,
        "--work",
        args.work,
    ]
    cmd += ["--seconds", str(args.seconds), "--repeats", str(args.repeats), "--rates", *map(str, args.rates)]
    out = subprocess.run(cmd, env={**os.environ, name: value}, capture_output=True, text=True, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"variant {name}={value} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def median_of(runs: list[dict]) -> dict[str, float]:
    """The median of each latency/throughput figure over ``runs``, errors summed."""
    m = {key: float(np.median([r[key] for r in runs])) for key in METRIC_KEYS}
    return {**m, "errors": sum(r["errors"] for r in runs), "requests": sum(r["requests"] for r in runs)}


def summarize(runs: dict[str, dict[str, list[dict]]], variants: dict[str, str], setting: str) -> list[dict]:
    """Per rate and variant: the medians over all runs, every run's p99, and ``ratio`` = the
    variant's median p99 / the baseline's at the same rate."""
    rows = []
    for rate in runs["baseline"]:
        base = median_of(runs["baseline"][rate])
        for variant, value in variants.items():
            m = median_of(runs[variant][rate])
            m["ratio"] = m["p99_ms"] / base["p99_ms"]
            m["p99_ms_runs"] = [round(r["p99_ms"], 1) for r in runs[variant][rate]]
            config = {
                "variant": variant,
                setting: value,
                "rate": float(rate),
                "runs": len(runs[variant][rate]),
            }
            rows.append(row(config, m, method="median over runs"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--work", default="runs/serve_load", help="artifacts dir shared with serve_load")
    parser.add_argument("--setting", default=METRICS_COLLECTION, help="the environment variable to vary")
    parser.add_argument("--baseline", default="1", help="its value in the baseline (Ray's default)")
    parser.add_argument("--candidate", default="0", help="its value in the candidate")
    parser.add_argument("--rates", type=float, nargs="+", default=[120.0, 150.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    from workflows.report import write_report

    variants = {"baseline": args.baseline, "candidate": args.candidate}
    runs: dict[str, dict[str, list[dict]]] = {v: {str(r): [] for r in args.rates} for v in variants}
    rows, started, load_before = [], time.time(), os.getloadavg()[0]
    for i in range(args.rounds):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for variant in order:
            result = run_variant(args, args.setting, variants[variant])
            for rate, rate_runs in result["runs"].items():
                runs[variant][rate] += rate_runs
                for j, r in enumerate(rate_runs):
                    config = {"variant": variant, args.setting: variants[variant], "rate": float(rate)}
                    rows.append(row({**config, "round": i + 1, "run": j + 1}, r))
                p99s = [round(r["p99_ms"], 1) for r in rate_runs]
                print(f"round {i + 1} {variant} ({args.setting}={variants[variant]}) {rate}/s: p99 {p99s}")
    summary_rows = summarize(runs, variants, args.setting)
    report = {
        "dataset": os.path.basename(os.path.abspath(args.data)),
        "setting": args.setting,
        "results": summary_rows + rows,
        "seconds_total": time.time() - started,
    }
    rates = ", ".join(f"{r:g}" for r in args.rates)
    report["notes"] = (
        f"`python -m benchmarks.serve_env_ab --rounds {args.rounds}`: BM25 detect → retrieve through "
        f"direct ingress, 8 clients paced at {rates} req/s, {args.repeats} runs of {args.seconds:g} s "
        f"per rate in each of {args.rounds} rounds (order alternating), each variant in its own local "
        f"Ray; {args.setting} = {args.baseline} (baseline) vs {args.candidate} (candidate). ratio = "
        "median p99 / baseline median p99 at the same rate. 2 CPU cores, client and server on the "
        f"same cores; 1-min load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at "
        "the end.\n"
    )
    write_report(
        report, args.out, title=f"Serve A/B: {args.setting}", plot=False, table=markdown(summary_rows)
    )


def row(config: dict, metrics: dict, method: str = "serve: detect→retrieve, paced") -> dict:
    return {"method": method, "config": config, "split": "test", "metrics": metrics}


def markdown(summary_rows: list[dict]) -> str:
    """The summary table: per variant and rate, medians over all runs and each run's p99."""
    head = ["variant", "setting", "rate req/s", "runs", "p50 ms", "p99 ms (median)", "p99 of each run"]
    head += ["req/s", "errors", "p99 ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in summary_rows:
        c, m = r["config"], r["metrics"]
        setting = next(f"{k}={v}" for k, v in c.items() if k not in ("variant", "rate", "runs"))
        each = ", ".join(f"{x:g}" for x in m["p99_ms_runs"])
        cells = [c["variant"], setting, f"{c['rate']:g}", str(c["runs"]), f"{m['p50_ms']:.1f}"]
        cells += [f"{m['p99_ms']:.1f}", each, f"{m['rps']:.0f}", str(m["errors"]), f"{m['ratio']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
