"""Read the artifacts that ``toolscout preprocess`` writes back into a :class:`Dataset`.

Layout of a prepared directory (local or ``s3://``)::

    manifest.json          row counts, reject counts, content hashes, config
    rejects.jsonl          every rejected row: file, line, reason, content
    corpus/*.parquet       one row per tool: raw text + parsed fields + metadata (JSON string)
    queries/*.parquet      _id, text
    qrels/*.parquet        split, query, tool, score  (train / valid / test [/ test_unseen])
    neg_queries/*.parquet  text, split  (train / valid / test, for detection)
    scenes/*.parquet       kind (query_scene | scene_tool), split, left, right
    graphs/*.npz           co-occurrence and bipartite graphs + *.ids.json
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow.parquet as pq

from components.data import io
from components.data.graphs import load_graphs
from components.data.types import Dataset

MANIFEST = "manifest.json"


def is_prepared(path: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether ``path`` holds preprocessing output (it has a manifest)."""
    return io.exists(io.join(path, MANIFEST), storage_options)


def read_manifest(path: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a prepared directory."""
    return json.loads(io.read_bytes(io.join(path, MANIFEST), storage_options))


def read_table(path: str, name: str, storage_options: dict[str, Any] | None = None) -> list[dict]:
    """All rows of one parquet table directory, as dicts."""
    target = io.join(path, name)
    fs = io.filesystem(target, storage_options)
    files = sorted(p for p in fs.find(target) if p.endswith(".parquet"))
    rows: list[dict] = []
    for file in files:
        with fs.open(file, "rb") as f:
            rows.extend(pq.read_table(f).to_pylist())
    return rows


def complete(path: str, name: str, rows: list[dict], manifest: dict[str, Any]) -> list[dict]:
    """``rows`` of table ``name``, if there are as many as the manifest says.

    ``preprocess`` writes the manifest last, but a copy of the directory (a sync stopped
    part-way, an upload in another order) can hold it before every table: loaded as it was, such
    a copy trained and evaluated on partial splits without a word.

    Raises:
        ValueError: the table has another number of rows than the manifest records.
    """
    expected = ((manifest.get("outputs") or {}).get(name) or {}).get("rows")
    if expected is not None and len(rows) != expected:
        raise ValueError(
            f"{io.join(path, name)}: {len(rows)} rows where its manifest records {expected}; the "
            "prepared directory is incomplete (copy it again, or run toolscout preprocess again)"
        )
    return rows


def in_order(rows: list[dict]) -> list[dict]:
    """Rows sorted by their ``order`` column when they have one (training data order is seeded
    from it, so two loads of one prepared directory must agree)."""
    return sorted(rows, key=lambda r: r["order"]) if rows and "order" in rows[0] else rows


def load_prepared(
    path: str, storage_options: dict[str, Any] | None = None, manifest: dict[str, Any] | None = None
) -> Dataset:
    """Rebuild the dataset (with its train/valid/test splits) from a prepared directory
    (``manifest``: its manifest, if the caller has read it already)."""
    manifest = manifest or read_manifest(path, storage_options)

    def table(name: str) -> list[dict]:
        return complete(path, name, read_table(path, name, storage_options), manifest)

    corpus = {
        r["id"]: {
            "_id": r["id"],
            "title": r["title"],
            "text": r["raw"],
            # A JSON string (see workflows.preprocess.table_rows); older artifacts have no column.
            "metadata": json.loads(r.get("metadata") or "{}"),
        }
        for r in in_order(table("corpus"))
    }
    # Ray Data names parquet files at random, so file order is not row order: every table carries
    # an "order" column (tables written before it existed keep their file order).
    queries = {r["_id"]: r["text"] for r in in_order(table("queries"))}
    qrels: dict[str, dict[str, dict[str, int]]] = {s: {} for s in manifest["splits"]}
    for r in in_order(table("qrels")):
        qrels[r["split"]].setdefault(r["query"], {})[r["tool"]] = int(r["score"])
    query_scene: dict[str, dict[str, str]] = {}
    scene_tool: dict[str, list[str]] = {}
    for r in in_order(table("scenes")):
        if r["kind"] == "scene_tool":
            scene_tool.setdefault(r["left"], []).append(r["right"])
        else:
            query_scene.setdefault(r["split"], {})[r["left"]] = r["right"]
    neg = in_order(table("neg_queries"))
    neg_split: dict[str, list[str]] = {name: [] for name in manifest.get("neg_splits", [])}
    for r in neg:
        neg_split.setdefault(r["split"], []).append(r["text"])
    return Dataset(
        name=manifest["dataset"],
        corpus=corpus,
        queries=queries,
        qrels=qrels,
        query_scene=query_scene,
        scene_tool=scene_tool,
        neg_queries=[r["text"] for r in neg],
        neg_split=neg_split,
        graphs=complete_graphs(path, load_graphs(path, storage_options), manifest),
    )


def complete_graphs(path: str, graphs: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """``graphs``, if they are every graph the manifest records, each of its recorded shape and
    number of edges. A copy missing ``query_scene`` trained MassTool without scenes, silently.

    Raises:
        ValueError: a recorded graph is missing or not the one recorded.
    """
    for name, info in (manifest.get("graphs") or {}).items():
        where = io.join(path, "graphs", f"{name}.npz")
        found = graphs.get(name)
        if found is None or list(found.matrix.shape) != info["shape"] or int(found.matrix.nnz) != info["nnz"]:
            what = "is missing" if found is None else f"is {found.matrix.shape} with {found.matrix.nnz} edges"
            raise ValueError(
                f"{where} {what} where its manifest records {tuple(info['shape'])} with "
                f"{info['nnz']} edges; the prepared directory is incomplete (copy it again, or run "
                "toolscout preprocess again)"
            )
    return graphs
