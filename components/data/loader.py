"""Load a tool-retrieval dataset in the BEIR layout from a local directory or an ``s3://`` URL.

Layout::

    corpus.jsonl                {"_id", "title", "text", "metadata"} per tool
    queries.jsonl               {"_id", "text", "metadata"} per query
    qrels/<split>.tsv           header "query-id corpus-id score", then one pair per line
    query_scene_<split>.txt     optional: "query-id scene-id" (a scene = one query's tool set)
    scene_tool.txt              optional: "scene-id tool-id"
    tooldet/neg_queries.jsonl   optional: queries that need no tool (JSON strings)

Loading runs in three steps so that :mod:`workflows.preprocess` can run the middle one on Ray
Data: :func:`discover` lists the files, :func:`parse_file` turns each into rows and rejects, and
:func:`assemble` runs the whole-file checks and builds the :class:`Dataset`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from components.data import io
from components.data.parse import split_lines
from components.data.rejects import DatasetError, RejectLog
from components.data.resolve import (
    not_tool_queries,
    one_scene_per_query,
    parse_lines,
    require_rows,
    resolve_pairs,
    resolve_qrels,
    resolve_records,
    unique_texts,
)
from components.data.splits import same_request
from components.data.types import Dataset, Qrels

NEG_QUERIES = "tooldet/neg_queries.jsonl"
# Present while a retrain rewrites a dataset in place (components.data.beir.rewrite_beir): a dataset
# holding it is part old, part new, and is not read until the rewrite is finished.
REWRITING = ".rewriting.json"
RECORD_HINT = 'JSON objects like {"_id": "1", "text": "..."}'


@dataclass(frozen=True)
class SourceFile:
    """One input file: its path relative to the dataset root and how to parse it."""

    rel: str
    kind: str  # "records" | "qrels" | "pairs" | "neg"


def list_splits(root: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """Names of the qrels splits present under ``root/qrels``."""
    qdir = io.join(root, "qrels")
    fs = io.filesystem(qdir, storage_options)
    if not fs.exists(qdir):
        return []
    names = [os.path.basename(p.rstrip("/")) for p in fs.ls(qdir, detail=False)]
    return sorted(n[: -len(".tsv")] for n in names if n.endswith(".tsv"))


def split_names(splits: str | Iterable[str]) -> list[str]:
    """``data.splits`` as a list: one name given alone (``data.splits=train`` on the command line)
    is that split, not the characters of it, and a name given twice counts once."""
    return list(dict.fromkeys([splits] if isinstance(splits, str) else splits))


def discover(
    root: str, splits: str | list[str] | None = None, storage_options: dict[str, Any] | None = None
) -> list[SourceFile]:
    """The files to read for ``splits`` (all present if ``None``), checking required ones exist.

    Raises:
        DatasetError: ``corpus.jsonl``/``queries.jsonl`` missing, no qrels, a requested split absent,
            or a rewrite of the dataset stopped part-way (:data:`REWRITING`).
    """
    for rel in ("corpus.jsonl", "queries.jsonl"):
        if not io.exists(io.join(root, rel), storage_options):
            raise DatasetError(f"{io.join(root, rel)}: required file is missing")
    if io.exists(io.join(root, REWRITING), storage_options):
        raise DatasetError(
            f"{io.join(root, REWRITING)}: a retrain stopped while rewriting this dataset, so it is part "
            "old and part new; run the retrain again (it finishes the rewrite first), or copy the "
            "complete copy the file names over it and delete the file"
        )
    available = list_splits(root, storage_options)
    wanted = available if splits is None else split_names(splits)
    missing = [s for s in wanted if s not in available]
    if missing:
        raise DatasetError(
            f"{io.join(root, 'qrels')}: split(s) {missing} not found; available: {available or 'none'}"
        )
    if not wanted:
        raise DatasetError(f"{io.join(root, 'qrels')}: no qrels/<split>.tsv files found")
    files = [SourceFile("corpus.jsonl", "records"), SourceFile("queries.jsonl", "records")]
    files += [SourceFile(f"qrels/{s}.tsv", "qrels") for s in wanted]
    if io.exists(io.join(root, "scene_tool.txt"), storage_options):
        files.append(SourceFile("scene_tool.txt", "pairs"))
    # Read even without scene_tool.txt, so that assemble() rejects their lines with the reason
    # instead of the scenes vanishing with no word.
    files += [
        SourceFile(f"query_scene_{s}.txt", "pairs")
        for s in wanted
        if io.exists(io.join(root, f"query_scene_{s}.txt"), storage_options)
    ]
    if io.exists(io.join(root, NEG_QUERIES), storage_options):
        files.append(SourceFile(NEG_QUERIES, "neg"))
    return files


def refuse_directory(path: str, storage_options: dict[str, Any] | None = None) -> None:
    """A :class:`DatasetError` when the source "file" at ``path`` is a directory of parts."""
    if io.filesystem(path, storage_options).isdir(path):
        raise DatasetError(f"{path}: is a directory (parts written by Spark or Ray?); expected one file")


def read_source(root: str, rel: str, storage_options: dict[str, Any] | None = None) -> bytes:
    """Bytes of one source file; an empty file is a :class:`DatasetError` naming it."""
    path = io.join(root, rel)
    data = io.read_bytes(path, storage_options)
    if not data.removeprefix(b"\xef\xbb\xbf").strip():  # a UTF-8 BOM alone is empty too (as on Ray)
        refuse_directory(path, storage_options)  # an object-store prefix reads as b""
        raise DatasetError(f"{path}: file is empty; expected one record per line")
    return data


def parse_file(source: SourceFile, data: bytes) -> tuple[list, list]:
    """Rows and rejects of one file (the unit of work Ray Data runs in parallel)."""
    return parse_lines(source.kind, source.rel, split_lines(data))


def assemble(name: str, rows: dict[str, list], log: RejectLog) -> Dataset:
    """Run the whole-file checks over parsed rows (keyed by relative path) and build the dataset."""
    require_rows("corpus.jsonl", rows["corpus.jsonl"], RECORD_HINT)
    corpus = resolve_records("corpus.jsonl", rows["corpus.jsonl"], log)
    require_rows("queries.jsonl", rows["queries.jsonl"], RECORD_HINT)
    records = resolve_records("queries.jsonl", rows["queries.jsonl"], log)
    queries = {qid: rec["text"] for qid, rec in records.items()}

    qrels = {}
    for rel in sorted(r for r in rows if r.startswith("qrels/")):
        require_rows(rel, rows[rel], "tab-separated rows 'query-id corpus-id score'")
        qrels[rel[len("qrels/") : -len(".tsv")]] = resolve_qrels(rel, rows[rel], queries, corpus, log)
    one_split_per_query(qrels, rows, log)
    note_repeated_requests(qrels, queries, log)

    scene_tool: dict[str, list[str]] = {}
    if "scene_tool.txt" in rows:
        pairs = resolve_pairs(
            "scene_tool.txt", rows["scene_tool.txt"], None, corpus, ("scene-id", "tool-id"), log
        )
        for sid, tid in pairs:
            scene_tool.setdefault(sid, []).append(tid)
    query_scene: dict[str, dict[str, str]] = {}
    for split in qrels:
        rel = f"query_scene_{split}.txt"
        if rel in rows and "scene_tool.txt" not in rows:
            for number, (qid, sid) in sorted(rows[rel], key=lambda r: r[0]):
                log.add(
                    rel,
                    number,
                    f"scene-id {sid!r} names no tools: scene_tool.txt is missing",
                    f"{qid}\t{sid}",
                )
        elif rel in rows:
            pairs = resolve_pairs(rel, rows[rel], qrels[split], scene_tool, ("query-id", "scene-id"), log)
            query_scene[split] = one_scene_per_query(rel, rows[rel], pairs, log)

    neg_rows = not_tool_queries(
        NEG_QUERIES, sorted(rows.get(NEG_QUERIES, []), key=lambda r: r[0]), queries, log
    )
    neg = unique_texts(NEG_QUERIES, neg_rows, log)
    return Dataset(name, corpus, queries, qrels, query_scene, scene_tool, neg)


def split_order(splits: Iterable[str]) -> list[str]:
    """Which split keeps a query judged in several: evaluation splits before train, so that a
    repeated query never lets a model train on what it is scored on."""
    rest = sorted(s for s in splits if s not in ("test", "valid", "train"))
    return [s for s in ("test", "valid") if s in splits] + rest + (["train"] if "train" in splits else [])


def one_split_per_query(qrels: dict[str, Qrels], rows: dict[str, list], log: RejectLog) -> None:
    """Reject (in place) the judgements of a query in any split after the first that judges it
    (:func:`split_order`), each with its file and line: a query in train and test would leak."""
    owner: dict[str, str] = {}
    for split in split_order(qrels):
        rel = f"qrels/{split}.tsv"
        repeated = {qid for qid in qrels[split] if qid in owner}
        for number, (qid, tid, score) in sorted(rows[rel], key=lambda r: r[0]):
            # Only the row that was kept: one rejected already (a conflicting score of the same
            # pair) is not rejected a second time.
            if qid in repeated and qrels[split].get(qid, {}).get(tid) == score:
                log.add(
                    rel,
                    number,
                    f"query-id {qid!r} is judged in qrels/{owner[qid]}.tsv too; a query belongs to one split",
                    f"{qid}\t{tid}\t{score}",
                )
        for qid in repeated:
            del qrels[split][qid]
        owner.update(dict.fromkeys(qrels[split], split))


def note_repeated_requests(qrels: dict[str, Qrels], queries: dict[str, str], log: RejectLog) -> None:
    """Count, in the load's notes, the queries of each other split that ask a training query's
    request under another id (text equal up to case, punctuation and spacing). Given splits are
    kept as they are, but a score on such queries partly measures memory, so the count is shown."""
    trained = {same_request(queries[q]) for q in qrels.get("train", {})}
    for split in sorted(s for s in qrels if s != "train"):
        n = sum(same_request(queries[q]) in trained for q in qrels[split])
        if n:
            log.note(f"qrels/{split}.tsv: queries repeating a train query's text under another id", n)


def dataset_name(root: str) -> str:
    """A dataset's default report name: the last path component of its root."""
    return os.path.basename(root.rstrip("/")) or root


def load_dataset(
    root: str,
    splits: list[str] | None = None,
    *,
    strict: bool = False,
    log: RejectLog | None = None,
    storage_options: dict[str, Any] | None = None,
    name: str | None = None,
) -> Dataset:
    """Load and validate a dataset in one process.

    Args:
        root: Local directory or ``s3://bucket/prefix``.
        splits: Qrels splits to load; every one named must exist. ``None`` loads all present.
        strict: Raise :class:`StrictModeError` if any row was rejected.
        log: Reject log to append to (a new one if ``None``); read it for counts and write it out.
        storage_options: fsspec options for remote roots.
        name: Dataset name for reports; the directory name by default.

    Raises:
        DatasetError: a required file is missing or empty, or a requested split does not exist.
    """
    log = log if log is not None else RejectLog()
    rows: dict[str, list] = {}
    for source in discover(root, splits, storage_options):
        parsed, rejects = parse_file(source, read_source(root, source.rel, storage_options))
        rows[source.rel] = parsed
        log.extend(rejects)
    dataset = assemble(name or dataset_name(root), rows, log)
    if strict:
        log.check_strict()
    return dataset
