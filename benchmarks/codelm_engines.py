"""One trained ToolGen / ToolWeaver model, its constrained decoder on PyTorch, llama.cpp and vLLM.

The generative methods (ToolGen, arXiv 2410.03439; ToolWeaver, arXiv 2601.21947) retrieve by
trie-constrained beam search over their LM. On CPU replicas that search can run on llama.cpp over
a GGUF export of the trained LM (``engine: llama.cpp``; :mod:`components.generative.gguf_export`).
This benchmark loads one saved artifact and, for each engine, scores the whole split (the rankings
must stay those of PyTorch: recall / nDCG and the share of queries whose top-3 differ) and times
single-query retrieval (p50 / p99 per query, as a serving replica answers one request) and the
split in one call (queries per second). The in-process engines run one after the other on the same
queries; ``ratio`` is the engine's p50 over PyTorch's. With ``--vllm-python`` the same LM (tool or
code tokens included) is then served by the Ray Serve LLM app on a local Ray, on vLLM in that
interpreter's environment, and the decoder asks it for each step's allowed tokens
(``engine: vllm``, :mod:`components.generative.vllm_scorer`) through Serve's HTTP proxy.

    python benchmarks/codelm_engines.py --artifact <saved toolweaver or toolgen dir> \\
        --data ../shared/datasets/toollens [--threads 2] [--timed 200] [--vllm-python PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/toolgen.py

import numpy as np
import torch

from components import methods
from components.data import open_dataset
from components.metrics import evaluate_retrieval
from workflows.quiet import quiet_libraries
from workflows.report import metrics_table, write_report

ENGINES = {  # row name -> (engine, GGUF dtype)
    "transformers": ("transformers", "f32"),
    "llama.cpp f32": ("llama.cpp", "f32"),
    "llama.cpp f16": ("llama.cpp", "f16"),
}


def measure(method: Any, queries: dict[str, str], qrels: dict, timed: list[str]) -> dict[str, Any]:
    """Whole-split metrics and throughput, then single-query latencies on ``timed``."""
    method.retrieve({timed[0]: queries[timed[0]]}, 10)  # export / load / warm-up outside the timings
    started = time.perf_counter()
    results = method.retrieve(queries, 10)
    split_seconds = time.perf_counter() - started
    latencies = []
    for q in timed:
        t = time.perf_counter()
        method.retrieve({q: queries[q]}, 10)
        latencies.append((time.perf_counter() - t) * 1000)
    metrics = evaluate_retrieval(qrels, results)
    return {
        "results": results,
        "metrics": {
            "recall@3": metrics["recall@3"],
            "ndcg@3": metrics["ndcg@3"],
            "recall@5": metrics["recall@5"],
            "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99)),
            "rps": len(queries) / split_seconds,
        },
    }


def serve_on_vllm(method: Any, python: str) -> dict[str, Any]:
    """Deploy the Ray Serve LLM app with ``method``'s LM (saved to a temporary directory) on a local
    Ray; returns the ``engine_endpoint`` that decodes on it."""
    from benchmarks.serve_llm import deploy_llm_app

    saved = os.path.join(tempfile.mkdtemp(prefix="codelm-vllm-"), "artifact")
    method.save(saved)
    # The prompt (query_max_length) plus a code; vLLM's CPU engine in fp32, its KV cache 1 GiB.
    llm = {"model": os.path.join(saved, "lm"), "model_id": "codes", "max_model_len": 256}
    llm["tool_call_parser"] = None  # retrieval only: no tool-call parsing
    url, seconds = deploy_llm_app(llm, python)
    print(f"vLLM app deployed in {seconds:.0f} s", flush=True)
    return {"endpoint": url, "model": "codes", "timeout_s": 300}


def top3(results: dict[str, dict[str, float]]) -> dict[str, list[str]]:
    return {q: sorted(h, key=lambda t: -h[t])[:3] for q, h in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--artifact", help="a saved toolgen / toolweaver model directory")
    source.add_argument(
        "--lm",
        help="instead, an LM (hub name, path, smollm2-135m) given one new token per catalog tool, "
        "initialised from the tool's name and not trained: times the engines at that LM's size "
        "(its rankings mean nothing; `changed@3` still compares the engines)",
    )
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--split", default="test")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for both engines")
    parser.add_argument("--timed", type=int, default=200, help="queries timed one at a time")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N queries (smoke runs)")
    parser.add_argument("--note", default="", help="where the artifact comes from, for the notes")
    parser.add_argument(
        "--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES), help="in-process engines"
    )
    parser.add_argument(
        "--vllm-python", default=None, help="an interpreter with vLLM: adds the vllm row (Ray Serve LLM)"
    )
    parser.add_argument("--out", default="benchmarks/results/codelm_engines.json")
    args = parser.parse_args()
    quiet_libraries()
    torch.set_num_threads(args.threads)
    data = open_dataset(args.data)  # valid carved from train, as `toolscout bench` does
    qrels = data.qrels[args.split]
    queries = data.split_queries(args.split)
    if args.limit:
        queries = dict(list(queries.items())[: args.limit])
        qrels = {q: qrels[q] for q in queries}
    timed = list(queries)[: args.timed]
    if args.artifact:
        method = methods.load(args.artifact)
    else:  # ToolGen's token initialisation (mean of the name's subword rows) happens in index()
        method = methods.method_class("toolgen").from_dir(args.lm, {"query_max_length": 48})
    method.index(data.corpus)
    rows, reference = [], None
    if args.engines[0] != "transformers":
        parser.error("--engines must start with transformers: the other rows are compared with it")
    runs = [(label, *ENGINES[label], None) for label in args.engines]
    if args.vllm_python:
        runs.append(("vllm", "vllm", None, args.vllm_python))
    for label, engine, dtype, python in runs:
        # The same weights, another engine (vLLM's app is deployed after the in-process rows ran).
        endpoint = serve_on_vllm(method, python) if python else None
        method.use_engine(engine, dtype=dtype, threads=args.threads, endpoint=endpoint)
        print(f"{label}: {len(queries)} queries ...", flush=True)
        got = measure(method, queries, qrels, timed)
        metrics = got["metrics"]
        if reference is None:
            reference = got
        ref_top, our_top = top3(reference["results"]), top3(got["results"])
        metrics["changed@3"] = sum(ref_top[q] != our_top[q] for q in queries) / len(queries)
        metrics["ratio"] = metrics["p50_ms"] / reference["metrics"]["p50_ms"]
        row = {"method": f"{method.name} [{label}]", "config": method.config(), "split": args.split}
        rows.append({**row, "metrics": metrics})
        print(f"  {metrics}", flush=True)
    config = rows[0]["config"]
    notes = (
        f"One {rows[0]['method'].split(' ')[0]} model ({args.note or args.artifact or args.lm}), its "
        f"trie-constrained decoder ({config.get('num_beams')} beams) on PyTorch, on llama.cpp over a "
        "GGUF export of the same weights and (row `vllm`, where run) on vLLM's CPU build serving them "
        "through the Ray Serve LLM app (fp32, called over Serve's HTTP proxy, requests of up to 128 "
        f"named tokens, 8 at a time), {args.threads} CPU threads each in process, "
        f"{len(queries)} {args.split} "
        f"queries in one call (rps) and the first {len(timed)} one at a time (p50 / p99 per query). "
        "`changed@3`: share of queries whose top-3 tools differ from PyTorch's; `ratio`: p50 over "
        f"PyTorch's. Machine: {os.cpu_count()} CPUs, torch {torch.__version__}.\n"
    )
    report = {"dataset": data.name, "results": rows, "notes": notes}
    columns = ["recall@3", "ndcg@3", "recall@5", "changed@3", "p50_ms", "p99_ms", "rps", "ratio"]
    write_report(
        report,
        args.out,
        title="Constrained decoding engines: PyTorch vs llama.cpp (and vLLM)",
        table=metrics_table(rows, ["method", "split"], columns),
        plot=False,
    )
    with open(os.path.splitext(args.out)[0] + ".md") as f:
        print(f.read())


if __name__ == "__main__":
    main()
