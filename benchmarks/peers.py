"""The tool search agents use today, measured beside toolscout on the same encoder.

Peers, each on all-MiniLM-L6-v2 exactly as toolscout's dense baseline embeds (the packaged
``minilm``, mean pooling, the same tool texts), so that only the retrieval mechanism differs:

- ``langgraph_bigtool``: langgraph-bigtool's default tool retrieval, ``store.search`` over the
  tools in a LangGraph ``InMemoryStore`` with an embedding index on each tool's description;
- ``semantic_router``: semantic-router's ``IndexedRouter`` with one route per tool, whose
  utterances are the tool's training queries (its description when it has none: unseen tools,
  LiveMCPBench); library defaults (mean over hits) except ``top_k`` = 100 utterance hits, so that
  at least five routes can score;

next to toolscout's BM25, dense MiniLM zero-shot, and any trained artifact (``--model NAME=DIR``,
e.g. MassTool; ``--cold-model NAME=DIR`` for one trained on the cold-start split). On ToolLens
test (standard split, and the unseen-tool split of the cold-start mode: 10 % of tools held out of
training) and LiveMCPBench (zero-shot). Latency: one query at a time on CPU, p50 / p99 over every
test query; memory: the process's RSS growth while building.

    pip install -e ".[peers]"
    python benchmarks/peers.py [--model masstool=DIR] [--cold-model masstool=DIR] \
        [--toollens ../shared/datasets/toollens]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components import methods
from components.data import Dataset, open_dataset
from components.data.livemcpbench import convert
from components.data.loader import load_dataset
from components.data.tooltext import TOOL_FIELDS, tool_texts
from components.encoders.bi_encoder import BiEncoder
from components.encoders.text_encoder import TextEncoder, spec_from
from components.metrics import evaluate_retrieval
from components.training.spec import RunSpec
from workflows.report import metrics_table, write_report

KS = (1, 3, 5)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "peers.json")
TOOL_MAX_LENGTH = 96


class MiniLM:
    """toolscout's MiniLM text tower: normalised embeddings of texts (queries or tool texts)."""

    def __init__(self) -> None:
        self.model = BiEncoder(TextEncoder.from_spec(spec_from("minilm"))).eval()

    def __call__(self, texts: list[str], max_length: int | None = None) -> np.ndarray:
        return self.model.embed_texts(list(texts), max_length).numpy()


class BigtoolPeer:
    """langgraph-bigtool's retrieval: its default ``retrieve_tools`` over an InMemoryStore."""

    def __init__(self, minilm: MiniLM, k: int) -> None:
        from langgraph.store.memory import InMemoryStore
        from langgraph_bigtool.tools import get_default_retrieval_tool

        embed = lambda texts: minilm(texts, TOOL_MAX_LENGTH).tolist()  # noqa: E731
        self.store = InMemoryStore(index={"embed": embed, "dims": 384, "fields": ["description"]})
        self.retrieve_tools, _ = get_default_retrieval_tool(("tools",), limit=k)

    def index(self, ids: list[str], texts: list[str], train_queries: dict[str, list[str]]) -> None:
        for tid, text in zip(ids, texts, strict=True):
            self.store.put(("tools",), tid, {"description": text})

    def search(self, query: str) -> list[str]:
        return self.retrieve_tools(query, store=self.store)


class RouterPeer:
    """semantic-router: a route per tool, its training queries as utterances."""

    def __init__(self, minilm: MiniLM, k: int) -> None:
        from pydantic import PrivateAttr
        from semantic_router.encoders.base import DenseEncoder

        class Encoder(DenseEncoder):
            _embed: Any = PrivateAttr()

            def __call__(self, docs: list[Any]) -> list[list[float]]:
                # Tool texts (the routes of tools with no training queries) are cut where toolscout's
                # and bigtool's are; queries are shorter than that.
                return self._embed(docs, TOOL_MAX_LENGTH).tolist()

            async def acall(self, docs: list[Any]) -> list[list[float]]:
                return self(docs)

        self.encoder = Encoder(name="minilm")
        self.encoder._embed = minilm
        self.k = k

    def index(self, ids: list[str], texts: list[str], train_queries: dict[str, list[str]]) -> None:
        from semantic_router import IndexedRouter, Route

        routes = [
            Route(name=t, utterances=train_queries.get(t) or [text])
            for t, text in zip(ids, texts, strict=True)
        ]
        self.router = IndexedRouter(encoder=self.encoder, routes=routes, top_k=100)

    def search(self, query: str) -> list[str]:
        return [c.name for c in asyncio.run(self.router.acall(query, limit=self.k))]


def tool_queries(dataset: Dataset) -> dict[str, list[str]]:
    """Each tool's training queries (what semantic-router's routes are built from)."""
    out: dict[str, list[str]] = {}
    for qid, rel in dataset.qrels.get("train", {}).items():
        for tid in rel:
            out.setdefault(tid, []).append(dataset.queries[qid])
    return out


def measure(label: str, build, search, dataset: Dataset, split: str, config: dict) -> dict[str, Any]:
    """Build (memory, seconds), then answer every query of ``split`` one at a time."""
    rss = psutil.Process().memory_info().rss
    started = time.perf_counter()
    build()
    build_s = time.perf_counter() - started
    memory_mb = (psutil.Process().memory_info().rss - rss) / 2**20
    results, times = {}, []
    for qid, text in dataset.split_queries(split).items():
        t = time.perf_counter()
        ranked = search(text)
        times.append((time.perf_counter() - t) * 1000)
        results[qid] = {tid: float(len(ranked) - i) for i, tid in enumerate(ranked)}
    metrics = evaluate_retrieval(dataset.qrels[split], results, KS)
    metrics |= {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99))}
    metrics |= {"memory_mb": memory_mb, "build_seconds": build_s}
    return {"method": label, "config": config, "split": split, "metrics": metrics}


def toolscout_row(
    label: str, method: Any, dataset: Dataset, split: str, config: dict, k: int, fit: bool
) -> dict[str, Any]:
    """A toolscout method: built here (``fit``: BM25, zero-shot dense; nothing is trained) or loaded
    trained, then indexed on the catalog."""

    def build() -> None:
        for stage in method.stages if fit else ():
            method.fit(stage, dataset, RunSpec(name=f"peers-{label}", local_dir="runs/peers-ckpt"))
        method.index(dataset.corpus)

    def search(text: str) -> list[str]:
        ranked = method.retrieve({"q": text}, k)["q"]
        return sorted(ranked, key=lambda t: -ranked[t])

    return measure(label, build, search, dataset, split, config)


def run_dataset(dataset: Dataset, split: str, minilm: MiniLM, models: list[str], k: int) -> list[dict]:
    ids = list(dataset.corpus)
    texts = tool_texts(dataset.corpus, ids, TOOL_FIELDS)
    queries = tool_queries(dataset)
    rows = []
    for label, peer in (
        ("langgraph_bigtool", BigtoolPeer(minilm, k)),
        ("semantic_router", RouterPeer(minilm, k)),
    ):
        rows.append(
            measure(label, lambda p=peer: p.index(ids, texts, queries), peer.search, dataset, split, {})
        )
    untrained = {
        "bm25": ("bm25", {"profile": "default"}),
        "dense_minilm_zero_shot": ("dense", {"encoder": "minilm", "epochs": 0, "id_head": False}),
    }
    for label, (name, params) in untrained.items():
        rows.append(toolscout_row(label, methods.build(name, params), dataset, split, params, k, fit=True))
    for item in models:
        label, _, path = item.partition("=")
        rows.append(
            toolscout_row(label, methods.load(path), dataset, split, {"artifact": path}, k, fit=False)
        )
    for r in rows:
        r["dataset"] = dataset.name
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toollens", default="../shared/datasets/toollens")
    parser.add_argument("--livemcpbench", default="../shared/datasets/livemcpbench")
    parser.add_argument("--model", action="append", default=[], help="NAME=DIR, trained on ToolLens (repeat)")
    parser.add_argument(
        "--cold-model",
        action="append",
        default=[],
        help="NAME=DIR, trained on ToolLens's cold-start split (its unseen tools held out; repeat)",
    )
    parser.add_argument("--datasets", default="toollens,toollens_cold_start,livemcpbench")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    wanted = args.datasets.split(",")
    minilm, k = MiniLM(), max(KS)
    rows = []
    if "toollens" in wanted:
        rows += run_dataset(open_dataset(args.toollens, name="toollens"), "test", minilm, args.model, k)
    if "toollens_cold_start" in wanted:
        cold = open_dataset(args.toollens, {"mode": "cold_start"}, name="toollens_cold_start")
        rows += run_dataset(cold, "test_unseen", minilm, args.cold_model, k)
    if "livemcpbench" in wanted:
        convert(args.livemcpbench, "runs/livemcpbench")
        data = load_dataset("runs/livemcpbench", name="livemcpbench")
        rows += run_dataset(data, "test", minilm, args.model, k)
    columns = ("recall@3", "ndcg@3", "comp@3", "recall@5", "comp@5", "p50_ms", "p99_ms", "memory_mb")
    table = metrics_table(rows, ["dataset", "split", "method"], columns)
    report = {"dataset": "toollens+livemcpbench", "results": rows, "notes": __doc__.split("\n\n")[1] + "\n"}
    title = "Peers: langgraph-bigtool and semantic-router beside toolscout"
    write_report(report, args.out, title=title, plot=False, table=table)
    print(table, end="")


if __name__ == "__main__":
    main()
