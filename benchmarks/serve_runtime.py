"""The served MiniLM graph on each encoder runtime: detect → retrieve through Ray Serve.

    python -m benchmarks.serve_runtime --data ../shared/datasets/toollens --seconds 10

For each encoder runtime (PyTorch, ONNX Runtime fp32 and int8, OpenVINO fp32 and bf16; see
``benchmarks/encoder_runtime.py`` for the encoder alone and the recall change) the graph is
deployed as ``toolscout serve`` builds it, with the shipped batching and the answer cache off, on
the zero-shot MiniLM dense artifact that ``serve_batching.py`` builds (its score-threshold
detector reads the Retriever's top score, ``share_ranking`` as shipped, so a request makes one
encoder pass, and so does the in-process baseline). Loads go through direct
ingress on ToolLens test queries, every request forcing retrieval: one client (the unloaded
latency), eight clients in a closed loop (throughput), paced at ``--rate`` requests per second
(issue 29's target: p50 ≤ 15 ms, p99 ≤ 50 ms, no errors at 120 req/s), and paced at 0.8× the
eight clients' throughput where that is lower than ``--rate`` (the latency at a load the runtime
can sustain; past its capacity a paced load only queues). The in-process baseline is
the same two models called in this process, one query at a time and on batches of 8, in the same
run and on one thread, as each replica has; ``ratio`` is Serve's 8-client req/s over the batched
in-process req/s of the same runtime.
"""

from __future__ import annotations

import argparse
import os

import ray
from ray import serve

from benchmarks.encoder_runtime import cpu_name
from benchmarks.serve_batching import in_process, start
from benchmarks.serve_load import doors, load, row
from components.encoders.runtimes import AUTO, effective_runtime, native_runtimes
from components.serving.deploy import deploy_config, serve_config
from components.serving.models import DetectorModel, RetrieverModel
from workflows.ray_env import init_ray
from workflows.report import md_table, write_report
from workflows.serve import app_args, read_serve_config

SUSTAINABLE = 0.8  # of the 8-client closed-loop throughput: a paced rate the graph can hold
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "serve_runtime.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--work", default="runs/serve_batching", help="where the MiniLM artifact is built")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=120.0, help="paced load, requests per second")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    settings, data, artifacts, detector_file = start(args.data, args.work, ("dense",))
    artifact = artifacts["dense"]
    queries = list(data.split_queries("test").values())
    bodies = [{"query": q, "top_k": 5, "needs_tool_threshold": 0.0} for q in queries]

    runtimes = native_runtimes()  # openvino-bf16 would be the openvino row again on a CPU without bf16
    auto, cpu = effective_runtime(AUTO), cpu_name()
    rows, baselines = [], {}
    for runtime in runtimes:
        # Each runtime's own threshold, fitted on its own scores on valid (kept in the file).
        detector = DetectorModel(artifact, detector_file, args.data, encoder_runtime=runtime)
        retriever = RetrieverModel(artifact, runtime)
        baselines[runtime] = in_process(detector, retriever, queries, args.seconds)
        rows.append(row("in-process: detect→retrieve", {"encoder_runtime": runtime}, baselines[runtime]))
        b = baselines[runtime]
        print(f"{runtime} in-process: p50 {b['p50_ms']:.1f} ms, {b['rps']:.0f} req/s")
        del detector, retriever

    init_ray({"num_cpus": 2, "progress_bars": False, "local": True})  # serve.shutdown() below: our own Ray
    port = 18000 + os.getpid() % 1000
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    base = read_serve_config(None)
    flags = {"artifact": artifact, "catalog": os.path.abspath(args.data), "detector_file": detector_file}
    for runtime in runtimes:
        deploy_config(
            serve_config(app_args(base, {**flags, "cache_size": 0, "encoder_runtime": runtime}, []), base)
        )
        urls = doors(f"http://127.0.0.1:{port}")["direct ingress"]
        one = load(urls, bodies, 1, args.seconds)
        eight = load(urls, bodies, 8, args.seconds)
        paced = load(urls, bodies, 16, args.seconds, rate=args.rate)
        sustainable = min(args.rate, SUSTAINABLE * eight["rps"])
        held = paced if sustainable == args.rate else load(urls, bodies, 16, args.seconds, rate=sustainable)
        m = {
            "p50_ms_1": one["p50_ms"],
            "p99_ms_1": one["p99_ms"],
            "rps_8": eight["rps"],
            "ratio": eight["rps"] / baselines[runtime]["rps"],
            f"p50_ms_{args.rate:g}rps": paced["p50_ms"],
            f"p99_ms_{args.rate:g}rps": paced["p99_ms"],
            "paced_rps": paced["rps"],
            "sustainable_rate": sustainable,
            "p50_ms_sustainable": held["p50_ms"],
            "p99_ms_sustainable": held["p99_ms"],
            "errors": one["errors"] + eight["errors"] + paced["errors"] + held["errors"],
        }
        rows.append(row("serve: detect→retrieve, direct ingress", {"encoder_runtime": runtime}, m))
        print(
            f"{runtime} serve: 1 client p50 {m['p50_ms_1']:.1f} ms, 8 clients {m['rps_8']:.0f} req/s "
            f"({m['ratio']:.2f}x), {args.rate:g} req/s paced p50 {paced['p50_ms']:.1f} / p99 "
            f"{paced['p99_ms']:.1f} ms, errors {m['errors']}"
        )
    serve.shutdown()
    ray.shutdown()

    served = {r["config"]["encoder_runtime"]: r["metrics"] for r in rows if r["method"].startswith("serve")}
    table = md_table(
        [
            "encoder runtime",
            "in-process p50 ms",
            "in-process batch-8 req/s",
            "Serve 1 client p50 ms",
            "Serve 8 clients req/s",
            "× in-process",
            f"{args.rate:g} req/s p50 ms",
            f"{args.rate:g} req/s p99 ms",
            "achieved req/s",
            "paced at 0.8× capacity: req/s",
            "p50 ms",
            "p99 ms",
            "errors",
        ],
        [
            [
                r,
                f"{baselines[r]['p50_ms']:.1f}",
                f"{baselines[r]['rps']:.0f}",
                f"{served[r]['p50_ms_1']:.1f}",
                f"{served[r]['rps_8']:.0f}",
                f"{served[r]['ratio']:.2f}",
                f"{served[r][f'p50_ms_{args.rate:g}rps']:.1f}",
                f"{served[r][f'p99_ms_{args.rate:g}rps']:.1f}",
                f"{served[r]['paced_rps']:.0f}",
                f"{served[r]['sustainable_rate']:.0f}",
                f"{served[r]['p50_ms_sustainable']:.1f}",
                f"{served[r]['p99_ms_sustainable']:.1f}",
                str(served[r]["errors"]),
            ]
            for r in runtimes
        ],
    )
    notes = (
        f"Run: `python -m benchmarks.serve_runtime --data {args.data} --seconds {args.seconds:g} "
        f"--rate {args.rate:g}` on this {os.cpu_count()}-core machine ({cpu}; "
        f"`encoder_runtime: auto` runs {auto} here; openvino-bf16 "
        f"{'measured' if 'openvino-bf16' in runtimes else 'not measured: no native bf16'}; client, Ray "
        f"and every replica on the same cores; 1-min load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after). Serve environment: {settings}. Each load is "
        f"{args.seconds:g} s after 1 s of warm-up, "
        "one run per row.\n"
    )
    report = {"dataset": "toollens", "results": rows, "notes": notes, "cpu": cpu, "auto": auto}
    engines = "PyTorch, ONNX Runtime fp32 / int8, OpenVINO fp32 / bf16"
    title = f"Served MiniLM detect → retrieve on each encoder runtime ({engines})"
    write_report(report, args.out, title=title, plot=False, table=table)
    print("\n".join(table))


if __name__ == "__main__":
    main()
