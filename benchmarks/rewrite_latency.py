"""Query-rewriting latency on CPU: SmolLM2-135M-Instruct as query generation's zero-shot rewriter
(arXiv 2412.03573), in process (one request at a time, and batches of 8) and in the Serve graph
under load, next to the same graph without a rewriter in the same run.

    python -m benchmarks.rewrite_latency --data ../shared/datasets/toollens --seconds 20

It builds, under ``--work``, a BM25 artifact on ToolLens and a query-generation artifact wrapping it
(SmolLM2 zero-shot, RRF fusion: what ``benchmarks/results/querygen_toollens`` chose on valid for
zero-shot). In process: ``--single`` test queries rewritten one by one, then in batches of 8 (a
request's latency is its batch's, as under ``@serve.batch``). In Serve: detect → retrieve, then
detect → rewrite → retrieve with the ``querygen`` rewriter deployment (batches of up to 8, the
rewrite timeout raised to 30 s so every request is really rewritten, and the cache never hit:
each request is a different test query), at 1 and 8 closed-loop clients for ``--seconds`` each.
Every request forces retrieval. The rewrite's own time inside the graph comes from the answers'
``timings_ms.rewrite`` of a sequential probe.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import requests
import torch
from ray import serve

from benchmarks.serve_load import doors, load, row, summary, train_artifacts
from components.data import io, open_dataset
from components.methods.querygen.method import QueryGenMethod
from components.serving.deploy import apply_serve_env, deploy_config, serve_config
from components.serving.models import ensure_calibration
from components.serving.rewriter import QueryGenRewriter
from components.training.spec import RunSpec
from workflows.ray_env import init_ray
from workflows.report import strict_json
from workflows.serve import app_args, read_serve_config

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "rewrite_latency.json")


# The two CPU engines for the same weights: transformers on the dequantized copy, llama.cpp on the
# shipped 4-bit GGUF; one thread each, as each Serve replica gets one CPU.
GENERATORS = {
    "transformers": {"name_or_path": "smollm2-135m"},
    "llamacpp": {"engine": "llamacpp", "model": "smollm2-135m", "n_threads": 1},
}


def querygen_artifact(data_path: str, bm25: str, work: str, engine: str = "transformers") -> str:
    """SmolLM2 zero-shot in front of the BM25 artifact on ``engine``, saved once under ``work``."""
    path = os.path.join(work, "models", f"querygen-{engine}", "v0001")
    if not os.path.exists(os.path.join(path, "config.json")):
        method = QueryGenMethod(
            generator=GENERATORS[engine],
            retriever={"path": bm25},
            sft={"epochs": 0},
            align={"rounds": 0},
            fusion="rrf",
            valid_queries=20,  # the stage's valid check only: nothing is selected here
        )
        data = open_dataset(data_path)
        run = RunSpec(name="rewrite-latency", local_dir=os.path.join(work, "checkpoints"))
        for stage in method.stages:
            method.fit(stage, data, run)
        method.save(path)
    return path


def in_process(artifact: str, queries: list[str], batch: int) -> dict[str, float]:
    """Latency per request of the artifact's rewriter called directly, ``batch`` requests at once."""
    rewriter = QueryGenRewriter(artifact, batch_size=batch)
    rewriter.rewrite_many([(queries[0], [])] * batch)  # warm-up
    latencies = []
    started = time.perf_counter()
    for i in range(0, len(queries) - batch + 1, batch):
        t = time.perf_counter()
        rewriter.rewrite_many([(q, []) for q in queries[i : i + batch]])
        latencies += [time.perf_counter() - t] * batch  # each request waited for its batch
    m = summary(latencies, 0, time.perf_counter() - started)
    return {**m, "ms_per_query": float(np.mean(latencies)) * 1000 / batch}


def selector_in_process(
    catalog_dir: str, bm25: str, queries: list[str], n_threads: int, weights: str = "file"
) -> tuple[list[dict | None], dict[str, float]]:
    """The llama.cpp selector choosing among BM25's top 5 for each query, one at a time: its calls
    (None where it answered no complete call) and their latency."""
    from components import methods
    from components.serving.catalog import load_catalog
    from components.serving.selector_llamacpp import LlamaCppSelector

    retriever = methods.load(bm25)
    candidates = retriever.retrieve({str(i): q for i, q in enumerate(queries)}, 5)
    selector = LlamaCppSelector(load_catalog(catalog_dir), n_threads=n_threads, weights=weights)
    selector.select(queries[0], [], list(candidates["0"]))  # warm-up
    latencies, calls = [], []
    started = time.perf_counter()
    for i, query in enumerate(queries):
        t = time.perf_counter()
        calls.append(selector.select(query, [], list(candidates[str(i)])))
        latencies.append(time.perf_counter() - t)
    figures = summary(latencies, 0, time.perf_counter() - started)
    return calls, {**figures, "calls": sum(c is not None for c in calls)}


def probe_rewrite_ms(url: str, bodies: list[dict], n: int) -> dict[str, float]:
    """``timings_ms.rewrite`` of ``n`` sequential requests (new queries: no cache hit)."""
    times = []
    for body in bodies[:n]:
        r = requests.post(f"{url}/v1/select", json=body, timeout=60)
        r.raise_for_status()
        times.append(r.json()["timings_ms"]["rewrite"])
    p50, p99 = np.percentile(times, [50, 99])
    return {"rewrite_p50_ms": float(p50), "rewrite_p99_ms": float(p99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--work", default="runs/rewrite_latency")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--single", type=int, default=40, help="test queries for the in-process rows")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--engines", nargs="+", default=list(GENERATORS), choices=list(GENERATORS))
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as each Serve replica gets
    apply_serve_env()
    init_ray({"num_cpus": 2, "progress_bars": False, "local": True})
    work = os.path.abspath(args.work)
    data = open_dataset(args.data)
    bm25 = train_artifacts(data, work, 1, keys=("bm25",))["bm25"]
    detector_file = os.path.join(work, "detector.json")
    ensure_calibration(bm25, args.data, detector_file)
    artifacts = {e: querygen_artifact(os.path.abspath(args.data), bm25, work, e) for e in args.engines}
    queries = list(data.split_queries("test").values())
    rows = []
    for engine, artifact in artifacts.items():
        for batch in (1, 8):
            m = in_process(artifact, queries[: args.single], batch)
            rows.append(row(f"in-process: querygen rewrite (SmolLM2-135M, {engine})", {"batch": batch}, m))
            print(rows[-1])
    if "llamacpp" in artifacts:
        for threads in (1, 2):
            _, m = selector_in_process(os.path.abspath(args.data), bm25, queries[: args.single], threads)
            rows.append(row("in-process: selector (SmolLM2-135M, llamacpp)", {"threads": threads}, m))
            print(rows[-1])

    port = 18000 + os.getpid() % 1000
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    proxy = f"http://127.0.0.1:{port}"
    base = read_serve_config(None)
    bodies = [{"query": q, "top_k": 5, "needs_tool_threshold": 0.0} for q in queries]
    graphs: list[tuple[str, dict | None]] = [("detect→retrieve", None)]
    for engine, artifact in artifacts.items():
        rewriter = {"backend": "querygen", "path": artifact, "timeout_s": 30.0, "cache_size": 0}
        graphs.append((f"detect→rewrite(querygen, {engine})→retrieve", rewriter))
    baseline: dict[int, float] = {}
    offset = 0  # each rewriting load reads new queries: the rewrite cache (size 0 anyway) never answers
    for label, rewrite in graphs:
        flags = {"artifact": bm25, "catalog": os.path.abspath(args.data), "detector_file": detector_file}
        flags["cache_size"] = 0  # the loads replay the test queries: answers must come from the models
        if rewrite:
            flags["rewriter"] = rewrite
        deploy_config(serve_config(app_args(base, flags, []), base))
        urls = doors(proxy)["proxy"]
        for clients in args.clients:
            m = load(urls, bodies[offset:] if rewrite else bodies, clients, args.seconds)
            m.pop("versions", None)
            if rewrite is None:
                baseline[clients] = m["p50_ms"]
            else:
                offset += m["requests"] + 8 * clients  # and the warm-up's, at most a second's worth
                m["ratio"] = m["p50_ms"] / baseline[clients]
            config = {"path": "proxy", "clients": clients, "seconds": args.seconds}
            rows.append(row(f"serve: {label}", config, m))
            print(rows[-1])
        if rewrite:
            probe = probe_rewrite_ms(proxy, bodies[offset:], 20)
            rows.append(row(f"serve: {label}, rewrite hop", {"path": "proxy", "clients": 1}, probe))
            print(rows[-1])
    serve.shutdown()
    report = {"dataset": "toollens", "results": rows, "machine": f"{os.cpu_count()} CPUs, no GPU"}
    io.write_bytes(args.out, strict_json(report))
    write_markdown(report, args.out.replace(".json", ".md"), args)


def write_markdown(report: dict, out: str, args: argparse.Namespace) -> None:
    lines = [
        "# Query-rewriting latency on CPU (SmolLM2-135M zero-shot querygen rewriter)",
        "",
        f"Run: `python -m benchmarks.rewrite_latency --seconds {args.seconds:g}` on {report['machine']};"
        " ToolLens test queries, BM25 retriever. Engines: `transformers` (the dequantized float32"
        " copy, eager PyTorch, 1 thread) and `llamacpp` (the shipped 4-bit GGUF under llama.cpp,"
        " 1 thread), same weights and chat template. In-process rows: "
        f"{args.single} queries one by one (batch 1) and in batches of 8 (a request's latency is "
        "its batch's; llama.cpp decodes a batch's requests one after another). The selector rows: "
        "the llama.cpp selector choosing among BM25's top 5 under its call grammar, one query at a "
        "time (`calls` = answers that were a complete call). Serve rows: closed-loop clients "
        "through the proxy for "
        f"{args.seconds:g} s each after a 1 s warm-up; `ratio` is p50 over the same graph without "
        "a rewriter at the same client count, measured in this run. The rewrite hop row is "
        "`timings_ms.rewrite` of 20 sequential requests.",
        "",
        "| method | config | p50_ms | p99_ms | ms_per_query | rps | errors | ratio | calls |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(m: dict, key: str, fmt: str = "{:.1f}") -> str:
        return fmt.format(m[key]) if key in m else "-"

    for r in report["results"]:
        m = r["metrics"]
        cfg = ", ".join(f"{k} {v}" for k, v in r["config"].items())

        p50 = cell(m, "p50_ms") if "p50_ms" in m else cell(m, "rewrite_p50_ms")
        p99 = cell(m, "p99_ms") if "p99_ms" in m else cell(m, "rewrite_p99_ms")
        lines.append(
            f"| {r['method']} | {cfg} | {p50} | {p99} | {cell(m, 'ms_per_query')} "
            f"| {cell(m, 'rps', '{:.2f}')} | {cell(m, 'errors', '{:d}')} | {cell(m, 'ratio', '{:.2f}')} "
            f"| {cell(m, 'calls', '{:d}')} |"
        )
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
