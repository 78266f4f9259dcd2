"""Serve autoscaling under a ramped load: replicas added on ``target_ongoing_requests`` and removed
when the load falls, with the latency through the ramp.

    python -m benchmarks.serve_autoscale --data ../shared/datasets/toollens

The detect → retrieve graph (BM25 trained once under ``--work``, threshold detector calibrated on
valid) is deployed with the config file's options, except that Detector and Retriever autoscale
between 1 and ``--max-replicas`` replicas on ``--target`` ongoing requests each (short delays, so
a few-minute ramp shows both directions). An open-loop schedule then offers a rate that rises
linearly from ``--low`` to ``--high`` req/s over ``--up`` seconds, holds for ``--hold``, falls back
over ``--down`` and stays at ``--low`` for ``--tail`` seconds. Each request is sent at its slot's
time whatever the earlier ones are doing, through the ingress replicas' own ports (direct
ingress), and its latency counts from that slot, so queueing during a scale-up is charged to it.
Replica counts are sampled every ``--sample`` seconds. The report bins everything into
``--window``-second windows: offered and completed req/s, p50/p99 latency, errors and timeouts, replicas.
The client runs on the same cores as the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from typing import Any

import aiohttp
import numpy as np
import torch
from ray import serve

from benchmarks.encoder_runtime import cpu_name
from benchmarks.serve_load import CLIENT_TIMEOUT_S, doors, train_artifacts
from components.data import open_dataset
from components.serving.deploy import apply_serve_env, deploy_config, serve_config
from components.serving.models import ensure_calibration
from components.serving.replicas import replica_names
from workflows.ray_env import init_ray
from workflows.report import md_table, write_report
from workflows.serve import app_args, read_serve_config

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "serve_autoscale.json")
SCALED = ("Detector", "Retriever")


def ramp(low: float, high: float, up: float, hold: float, down: float, tail: float) -> list[float]:
    """Send times (s from the start) of an open-loop schedule: ``low`` → ``high`` req/s linearly over
    ``up`` s, ``high`` for ``hold`` s, back to ``low`` over ``down`` s, then ``low`` for ``tail`` s."""

    def rate(t: float) -> float:
        if t < up:
            return low + (high - low) * t / up
        if t < up + hold:
            return high
        if t < up + hold + down:
            return high - (high - low) * (t - up - hold) / down
        return low

    times, t, end = [], 0.0, up + hold + down + tail
    while t < end:
        times.append(t)
        t += 1.0 / rate(t)
    return times


class ReplicaSampler:
    """Counts each scaled deployment's running replicas every ``every`` seconds, in a thread."""

    def __init__(self, every: float) -> None:
        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        started = time.perf_counter()
        while not self._stop.is_set():
            counts = {name: len(replica_names(name)) for name in SCALED}
            self.samples.append((time.perf_counter() - started, counts))
            self._stop.wait(self.every)

    def __enter__(self) -> ReplicaSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# What became of a request: answered, given up by the client after CLIENT_TIMEOUT_S (a backlog
# past what the cores drain in time: overload, not a failure of the server), or failed (a non-200
# answer or a broken connection).
OK, TIMEOUT, ERROR = "ok", "timeout", "error"


async def offer(urls: list[str], bodies: list[dict], times: list[float]) -> list[tuple[float, float, str]]:
    """Post one request at each of ``times`` (round-robin over ``urls``); (slot, latency s,
    outcome: :data:`OK`, :data:`TIMEOUT` or :data:`ERROR`) each."""
    results: list[tuple[float, float, str]] = []
    connector = aiohttp.TCPConnector(limit=256)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()

        async def one(i: int, slot: float) -> None:
            try:
                async with session.post(
                    f"{urls[i % len(urls)]}/v1/select", json=bodies[i % len(bodies)]
                ) as r:
                    await r.read()
                    outcome = OK if r.status == 200 else ERROR
            except asyncio.TimeoutError:
                outcome = TIMEOUT
            except aiohttp.ClientError:
                outcome = ERROR
            results.append((slot, time.perf_counter() - t0 - slot, outcome))

        tasks = []
        for i, slot in enumerate(times):
            if (delay := t0 + slot - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, slot)))
        await asyncio.gather(*tasks)
    return results


def windows(results: list[tuple[float, float, str]], samples: list, window: float, end: float) -> list[dict]:
    """One row per ``window`` seconds: offered and completed req/s, latency, errors and timeouts,
    replicas (max).

    Offered, latency, errors and timeouts are of the requests scheduled in the window (latency
    from the scheduled send time, unanswered requests included: a timeout is the latency its
    client saw);
    completed counts the successful answers that arrived in the window, so a backlog shows as
    completed below offered, and its drain as completed above it.
    """
    rows = []
    for start in np.arange(0.0, end, window):
        mine = [(lat, outcome) for slot, lat, outcome in results if start <= slot < start + window]
        done = [1 for slot, lat, outcome in results if outcome == OK and start <= slot + lat < start + window]
        ms = [lat * 1000 for lat, _ in mine]
        replicas = [c for t, c in samples if start <= t < start + window]
        rows.append(
            {
                "t_s": float(start),
                "offered_rps": len(mine) / window,
                "rps": len(done) / window,
                "p50_ms": float(np.percentile(ms, 50)) if ms else float("nan"),
                "p99_ms": float(np.percentile(ms, 99)) if ms else float("nan"),
                "errors": sum(1 for _, outcome in mine if outcome == ERROR),
                "timeouts": sum(1 for _, outcome in mine if outcome == TIMEOUT),
                **{f"{n.lower()}_replicas": max((c[n] for c in replicas), default=0) for n in SCALED},
            }
        )
    return rows


def plot(rows: list[dict], path: str) -> None:
    """Offered rate and replicas (top), p50 / p99 latency (bottom), against time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(t, [r["offered_rps"] for r in rows], label="offered req/s")
    top.plot(t, [r["rps"] for r in rows], label="completed req/s")
    top.set_ylabel("req/s")
    right = top.twinx()
    for name in SCALED:
        right.step(t, [r[f"{name.lower()}_replicas"] for r in rows], where="post", linestyle="--", label=name)
    right.set_ylabel("replicas")
    top.legend(loc="upper left")
    right.legend(loc="upper right")
    bottom.plot(t, [r["p50_ms"] for r in rows], label="p50")
    bottom.plot(t, [r["p99_ms"] for r in rows], label="p99")
    bottom.set_yscale("log")
    bottom.set_ylabel("latency ms")
    bottom.set_xlabel("seconds")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def set_autoscaling(config: dict[str, Any], override: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Give the scaled deployments ``override`` as their autoscaling config (None: keep the file's),
    and return what each of them runs with.

    The override goes into the config file's per-deployment options, not the app's args: Serve
    applies those last, so an args-level override would be silently replaced.
    """
    app = config["applications"][0]
    by_name = {d["name"]: d for d in app.get("deployments") or []}
    if override is not None:
        for name in SCALED:
            by_name[name] = {**by_name.get(name, {"name": name}), "autoscaling_config": override}
    app["deployments"] = list(by_name.values())
    return {name: by_name[name]["autoscaling_config"] for name in SCALED}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--work", default="runs/serve_load")
    parser.add_argument("--low", type=float, default=10.0)
    parser.add_argument("--high", type=float, default=200.0)
    parser.add_argument("--up", type=float, default=90.0)
    parser.add_argument("--hold", type=float, default=30.0)
    parser.add_argument("--down", type=float, default=30.0)
    parser.add_argument("--tail", type=float, default=60.0)
    parser.add_argument("--max-replicas", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.5, help="target_ongoing_requests per replica")
    parser.add_argument(
        "--shipped",
        action="store_true",
        help="keep deploy/serve_config.yaml's autoscaling options (the baseline) instead of the above",
    )
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--sample", type=float, default=0.5)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    apply_serve_env()
    init_ray({"num_cpus": 2, "progress_bars": False, "local": True})
    data = open_dataset(args.data)
    work = os.path.abspath(args.work)
    bm25 = train_artifacts(data, work, 1, keys=("bm25",))["bm25"]
    detector_file = os.path.join(work, "detector.json")
    ensure_calibration(bm25, args.data, detector_file)
    bodies = [
        {"query": q, "top_k": 5, "needs_tool_threshold": 0.0} for q in data.split_queries("test").values()
    ]
    override = None
    if not args.shipped:
        override = {
            "min_replicas": 1,
            "max_replicas": args.max_replicas,
            "target_ongoing_requests": args.target,
            "metrics_interval_s": 0.5,
            "look_back_period_s": 3.0,
            "upscale_delay_s": 3.0,
            "downscale_delay_s": 15.0,
        }
    port = 18000 + os.getpid() % 1000
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    base = read_serve_config(None)
    flags = {"artifact": bm25, "catalog": os.path.abspath(args.data), "detector_file": detector_file}
    flags["cache_size"] = 0  # 19k requests over 1,877 test queries: a cache would answer most of them
    config = serve_config(app_args(base, flags, []), base)
    autoscaling = set_autoscaling(config, override)
    deploy_config(config)
    urls = doors(f"http://127.0.0.1:{port}").get("direct ingress") or [f"http://127.0.0.1:{port}"]
    times = ramp(args.low, args.high, args.up, args.hold, args.down, args.tail)
    print(f"{len(times)} requests over {times[-1]:.0f} s to {urls}", file=sys.stderr)
    with ReplicaSampler(args.sample) as sampler:
        results = asyncio.run(offer(urls, bodies, times))
    serve.shutdown()
    end = args.up + args.hold + args.down + args.tail
    rows = windows(results, sampler.samples, args.window, end)
    errors = sum(r["errors"] for r in rows)
    timeouts = sum(r["timeouts"] for r in rows)
    peak = {n: max(r[f"{n.lower()}_replicas"] for r in rows) for n in SCALED}
    final = {n: rows[-1][f"{n.lower()}_replicas"] for n in SCALED}
    report: dict[str, Any] = {
        "dataset": "toollens",
        "results": [
            {
                "method": "serve: detect→retrieve (BM25), ramped load",
                "config": {
                    "autoscaling": autoscaling,
                    **{k: getattr(args, k) for k in ("low", "high", "up", "hold", "down", "tail")},
                },
                "split": "test",
                "metrics": {
                    "requests": len(results),
                    "errors": errors,
                    "timeouts": timeouts,
                    **{f"peak_{n.lower()}_replicas": peak[n] for n in SCALED},
                    **{f"final_{n.lower()}_replicas": final[n] for n in SCALED},
                },
            }
        ],
        "windows": rows,
        "machine": f"{os.cpu_count()} CPUs ({cpu_name()}), client on the same cores",
        "cache_size": flags["cache_size"],
    }
    source = "deploy/serve_config.yaml as shipped" if args.shipped else "overridden by the flags"
    notes = (
        f"Run: `python -m benchmarks.serve_autoscale` on {report['machine']}; direct ingress "
        f"({len(urls)} ingress replica port(s)). Offered load {args.low:g} → {args.high:g} req/s over "
        f"{args.up:g} s, {args.hold:g} s at {args.high:g}, back over {args.down:g} s, {args.tail:g} s at "
        f"{args.low:g}; answer cache off; autoscaling ({source}): "
        f"{autoscaling}. {len(results)} requests, {errors} errors (a non-200 answer or a broken "
        f"connection), {timeouts} timeouts (not answered within the client's {CLIENT_TIMEOUT_S:g} s); peak "
        f"replicas {peak}, at the end {final}. Latency counts from each request's scheduled send time.\n"
    )
    table = md_table(
        [
            "t s",
            "offered req/s",
            "completed req/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "timeouts",
            *(f"{n} replicas" for n in SCALED),
        ],
        [
            [
                f"{r['t_s']:.0f}",
                f"{r['offered_rps']:.1f}",
                f"{r['rps']:.1f}",
                f"{r['p50_ms']:.1f}",
                f"{r['p99_ms']:.1f}",
                str(r["errors"]),
                str(r["timeouts"]),
                *(str(r[f"{n.lower()}_replicas"]) for n in SCALED),
            ]
            for r in rows
        ],
    )
    report["notes"] = notes
    write_report(
        report,
        args.out,
        title="Serve autoscaling under a ramped load",
        plot=False,
        table=table,
    )
    plot(rows, os.path.splitext(args.out)[0] + ".png")
    print(notes)


if __name__ == "__main__":
    main()
