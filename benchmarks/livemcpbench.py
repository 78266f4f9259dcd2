"""LiveMCPBench zero-shot: does what toolscout learns transfer to an MCP catalog nobody trained on?

Converts ``../shared/datasets/livemcpbench`` (70 MCP servers, 527 tools, 95 multi-tool tasks)
to the BEIR layout through the MCP catalog reader (:mod:`components.data.livemcpbench`), then
scores every method that can rank tools it never saw, at K = 1, 3, 5 (a task names up to 7 tools):

- ``bm25``: indexed on the catalog, nothing learned;
- ``dense_minilm_zero_shot``: all-MiniLM-L6-v2 as its package ships it (``encoder: minilm``);
- ``--model NAME=DIR``: any saved artifact trained on ToolLens whose method has the
  ``cold_start`` capability (it embeds new tools from their text), e.g. MassTool's.

ToolGen cannot take part: its tools are LM tokens learned in training, and a new catalog has none.

    python benchmarks/livemcpbench.py [--model masstool=DIR] [--source ../shared/datasets/livemcpbench]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components import methods
from components.data.livemcpbench import convert
from components.data.loader import load_dataset
from components.metrics import evaluate_retrieval
from components.training.spec import RunSpec
from workflows.report import metrics_table, write_report

KS = (1, 3, 5)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "livemcpbench.json")
COLUMNS = ("recall@3", "ndcg@3", "comp@3", "recall@5", "ndcg@5", "comp@5", "p50_ms")
UNTRAINED = {
    "bm25": ("bm25", {"profile": "default"}),
    "dense_minilm_zero_shot": (
        "dense",
        {"encoder": "minilm", "epochs": 0, "id_head": False, "tool_max_length": 96},
    ),
}


def score(method, dataset, label: str, config: dict) -> dict:
    """Index the catalog, rank every task (all at once, then one at a time for latency)."""
    started = time.perf_counter()
    method.index(dataset.corpus)
    index_s = time.perf_counter() - started
    queries = dataset.split_queries("test")
    metrics = evaluate_retrieval(dataset.qrels["test"], method.retrieve(queries, max(KS)), KS)
    times = []
    for qid, text in queries.items():
        t = time.perf_counter()
        method.retrieve({qid: text}, max(KS))
        times.append((time.perf_counter() - t) * 1000)
    metrics |= {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99))}
    return {"method": label, "config": config, "split": "test", "metrics": metrics, "index_seconds": index_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="../shared/datasets/livemcpbench")
    parser.add_argument("--work", default="runs/livemcpbench", help="where the BEIR conversion is written")
    parser.add_argument("--model", action="append", default=[], help="NAME=DIR of a saved artifact (repeat)")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    conversion = convert(args.source, args.work)
    dataset = load_dataset(args.work)
    rows = []
    for label, (name, params) in UNTRAINED.items():
        method = methods.build(name, params)
        for stage in method.stages:  # dense zero-shot builds its encoder here; nothing is trained
            method.fit(
                stage,
                dataset,
                RunSpec(name=f"livemcpbench-{label}", local_dir=os.path.join(args.work, "ckpt")),
            )
        rows.append(score(method, dataset, label, params))
    for item in args.model:
        label, _, path = item.partition("=")
        method = methods.load(path)
        if "cold_start" not in method.capabilities:
            raise SystemExit(
                f"{label}: {method.name} cannot rank tools it was not trained on (no cold_start)"
            )
        rows.append(score(method, dataset, label, {"artifact": path, **method.config()}))
    report = {"dataset": "livemcpbench", "conversion": conversion, "results": rows}
    table = metrics_table(rows, ["method"], COLUMNS)
    report["notes"] = (
        f"{conversion['tools']} tools from {len(set(t.split('/')[0] for t in dataset.corpus))} servers, "
        f"{conversion['tasks']} tasks with {conversion['judgements']} judged tools "
        f"({conversion['ambiguous_mentions']} of {conversion['mentions']} mentions name a tool more than one "
        f"server has: resolved to the server holding most of the task's tools; "
        f"{conversion['unmatched_mentions']} name no tool in the catalog and are left out). Zero-shot: no "
        "method saw this catalog or its tasks. p50_ms: one task at a time, CPU.\n"
    )
    title = "LiveMCPBench: zero-shot tool retrieval over a real MCP catalog"
    write_report(report, args.out, title=title, plot=False, table=table)
    print(table, end="")


if __name__ == "__main__":
    main()
