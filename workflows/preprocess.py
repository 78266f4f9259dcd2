"""``toolscout preprocess``: validate a dataset with Ray Data and write parquet + graph artifacts.

Reads a BEIR-layout dataset (local or ``s3://``), parses and validates it in parallel, carves the
validation (and optional cold-start) splits, normalises tool documents into fields, and writes to
the output directory (local or ``s3://``; layout in :mod:`components.data.prepared`):
parquet tables, a reject file, sparse graphs and a manifest with counts and content hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from components.data import io
from components.data.graphs import GRAPH_SPLIT, graph_inputs, qrels_pairs, save_sparse
from components.data.loader import assemble, dataset_name, discover
from components.data.prepared import MANIFEST
from components.data.rejects import RejectLog
from components.data.splits import splits_from_config
from components.data.tooltext import parse_tool_text
from components.data.types import Dataset
from workflows.ray_graphs import pairs_dataset, ray_bipartite, ray_cooccurrence
from workflows.ray_ingest import ingest


def table_rows(dataset: Dataset) -> dict[str, list[dict]]:
    """The prepared tables as rows (corpus rows are normalised later, on Ray Data).

    Tool ``metadata`` is kept as a JSON string: its values may differ in type from row to row,
    which one Arrow struct column cannot hold. Its keys keep their order (an MCP tool's parameters
    as the server listed them, which a selector's prompt follows).
    """
    corpus = [
        {"order": i, **rec, "metadata": json.dumps(rec.get("metadata") or {})}
        for i, rec in enumerate(dataset.corpus.values())
    ]
    queries = [{"order": i, "_id": q, "text": t} for i, (q, t) in enumerate(dataset.queries.items())]
    qrels = [
        {"split": s, "query": q, "tool": t, "score": v}
        for s, split in dataset.qrels.items()
        for q, rel in split.items()
        for t, v in rel.items()
    ]
    qrels = [{"order": i, **r} for i, r in enumerate(qrels)]
    scenes = [
        {"kind": "scene_tool", "split": "", "left": s, "right": t}
        for s, ts in dataset.scene_tool.items()
        for t in ts
    ]
    scenes += [
        {"kind": "query_scene", "split": sp, "left": q, "right": s}
        for sp, m in dataset.query_scene.items()
        for q, s in m.items()
    ]
    scenes = [{"order": i, **r} for i, r in enumerate(scenes)]
    # The loader keeps each no-tool text once, so a text names its split unambiguously.
    neg_of = {t: s for s, texts in dataset.neg_split.items() for t in texts}
    neg = [{"order": i, "text": t, "split": neg_of[t]} for i, t in enumerate(dataset.neg_queries)]
    return {"corpus": corpus, "queries": queries, "qrels": qrels, "scenes": scenes, "neg_queries": neg}


def normalise_tools(batch: dict[str, Any]) -> dict[str, list]:
    """Parse ToolBench-style tool text into fields (runs in parallel on Ray Data)."""
    out: dict[str, list] = {}
    for order, rid, title, text, metadata in zip(
        batch["order"], batch["_id"], batch["title"], batch["text"], batch["metadata"], strict=True
    ):
        row = {
            "order": int(order),
            "title": title,
            "metadata": metadata,
            **parse_tool_text(rid, text).to_row(),
        }
        for key, value in row.items():
            out.setdefault(key, []).append(value)
    return out


def content_hash(rows: list[dict]) -> str:
    """Order-independent sha256 of a table's rows (stable however Ray splits the parquet files)."""
    lines = sorted(json.dumps(r, sort_keys=True, ensure_ascii=False, default=str) for r in rows)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def write_tables(
    tables: dict[str, list[dict]], out: str, storage_options: dict | None = None
) -> dict[str, dict]:
    """Write each table as parquet with Ray Data; returns rows and content hash per table.

    The hash covers the rows handed in (the corpus before its fields are parsed, a pure function
    of them). An empty table removes what an earlier run left at its place.
    """
    filesystem = io.arrow_filesystem(out, storage_options)
    summary = {}
    for name, rows in tables.items():
        target = io.join(out, name)
        # What an earlier run left is removed by io.remove, object by object: Ray's "overwrite"
        # empties the directory through fsspec's rm, which reads "[", "*" and "?" in an s3:// path as
        # a pattern and failed on s3://b/exp[1] (a local path was fine).
        io.remove(target, storage_options)
        if rows:
            ds = ray.data.from_arrow(pa.Table.from_pylist(rows))
            if name == "corpus":
                ds = ds.map_batches(normalise_tools, batch_format="numpy")
            ds.write_parquet(target, filesystem=filesystem)
        summary[name] = {"rows": len(rows), "sha256": content_hash(rows)}
    return summary


def write_graphs(
    dataset: Dataset, out: str, parallelism: int, storage_options: dict | None = None
) -> dict[str, dict]:
    """Co-occurrence and bipartite graphs of the training split, built on Ray Data.

    Scenes are those of training queries only: a test query's scene is its set of tools. The
    ``graphs`` directory is rewritten whole, so a graph that this dataset lacks does not survive
    from an earlier run.
    """
    inputs = graph_inputs(dataset)  # the same inputs as the in-process build (training_graphs)
    _, queries, tools = inputs["query_tool"]
    q_idx, t_idx = qrels_pairs(dataset.qrels.get(GRAPH_SPLIT, {}), queries, tools)
    graphs = {
        "cooccurrence": (ray_cooccurrence(pairs_dataset(q_idx, t_idx, parallelism), len(tools)), tools, tools)
    }
    for name, (pairs, rows, cols) in inputs.items():
        graphs[name] = (ray_bipartite(pairs, rows, cols, parallelism), rows, cols)
    io.remove(io.join(out, "graphs"), storage_options)
    summary = {}
    for name, (matrix, rows, cols) in graphs.items():
        save_sparse(io.join(out, "graphs", name), matrix, rows, cols, storage_options)
        summary[name] = {
            "shape": list(matrix.shape),
            "nnz": int(matrix.nnz),
            "sum": float(np.asarray(matrix.sum())),
        }
    return summary


def redact(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config for the manifest, with storage options (they may hold credentials) masked."""
    data = dict(cfg.get("data", {}))
    if data.get("storage_options"):
        data["storage_options"] = {k: "***" for k in data["storage_options"]}
    return {**cfg, "data": data}


def same_place(a: str, b: str) -> bool:
    """Whether two dataset locations (local paths or URLs) name the same directory."""
    if io.is_remote(a) or io.is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(io.local_path(a)) == os.path.realpath(io.local_path(b))


def preprocess(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run the preprocessing job described by ``cfg`` (sections ``data``, ``splits``, ``preprocess``).

    Returns:
        The manifest that was written next to the artifacts.
    """
    data, pre = cfg["data"], cfg["preprocess"]
    root, out = data["path"], pre["output"]
    if same_place(root, out):
        # The prepared tables (qrels/ among them) would overwrite the raw files they are read from.
        raise ValueError(f"preprocess: the output {out} is the input dataset; write it elsewhere")
    opts = data.get("storage_options") or None
    if io.exists(io.join(out, "corpus.jsonl"), opts):
        # Another raw dataset: its qrels/ would be replaced by the prepared tables.
        raise ValueError(
            f"preprocess: the output {out} holds a raw dataset (corpus.jsonl); write it elsewhere"
        )
    started = time.perf_counter()
    log = RejectLog()
    sources = discover(root, data.get("splits"), opts)
    rows, inputs = ingest(root, sources, log, opts, parallelism=int(pre.get("parallelism", 8)))
    raw = assemble(data.get("name") or dataset_name(root), rows, log)
    io.makedirs(out, opts)
    # The manifest marks a finished output (is_prepared): gone until this run writes it, last.
    io.remove(io.join(out, MANIFEST), opts)
    # Every reject is known once the files are assembled: write them before --strict can fail,
    # whose message shows only a few.
    rejects = io.join(out, "rejects.jsonl")
    log.write(rejects, opts)
    if data.get("strict"):
        log.check_strict(written_to=rejects)
    dataset = splits_from_config(raw, cfg.get("splits"))
    parsed_at = time.perf_counter()
    outputs = write_tables(table_rows(dataset), out, opts)
    graphs = write_graphs(dataset, out, int(pre.get("parallelism", 8)), opts)
    manifest = {
        "dataset": dataset.name,
        "source": root,
        "splits": sorted(dataset.qrels),
        "neg_splits": sorted(dataset.neg_split),
        "counts": dataset.summary(),
        "rejects": {"total": len(log), "by_file": log.counts(), "by_reason": log.reason_counts()},
        "notes": dict(log.notes),
        "inputs": inputs,
        "outputs": outputs,
        "graphs": graphs,
        "config": redact(cfg),
        "ray_version": ray.__version__,
        "seconds": {"ingest": parsed_at - started, "total": time.perf_counter() - started},
    }
    io.write_bytes(io.join(out, MANIFEST), json.dumps(manifest, indent=2, default=str).encode(), opts)
    return manifest
