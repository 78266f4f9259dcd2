"""Write a :class:`Dataset` back in the BEIR layout that :mod:`.loader` reads (local or s3://).

Used when a retrain merges an increment into its base data: the merged data is written once and
becomes the next round's base, readable by every command like any other dataset.
"""

from __future__ import annotations

import json
import os
from typing import Any

from components.data import io
from components.data.loader import NEG_QUERIES, REWRITING, load_dataset
from components.data.rejects import DatasetError
from components.data.types import Dataset


def _lines(rows: list[str]) -> bytes:
    return "".join(r + "\n" for r in rows).encode()


def write_beir(dataset: Dataset, root: str, storage_options: dict[str, Any] | None = None) -> dict[str, int]:
    """Write ``dataset`` (as loaded, before any split is carved) under ``root``; returns counts.

    Each file is replaced whole, one after the other, and ``queries.jsonl`` comes last: a retrain
    rewriting its base that stops part-way then leaves judgements of queries the base does not
    have yet, which the loader rejects by name and the increment's rerun adds again. Written
    first (as before), the base held the increment's queries without their judgements, and the
    rerun rejected every one of them as already in the base: the judgements were lost. A rewrite
    of a dataset in place goes through :func:`rewrite_beir`, which marks it while it runs.
    """
    corpus = [json.dumps(rec, ensure_ascii=False) for rec in dataset.corpus.values()]
    io.write_bytes(io.join(root, "corpus.jsonl"), _lines(corpus), storage_options)
    queries = [json.dumps({"_id": q, "text": t}, ensure_ascii=False) for q, t in dataset.queries.items()]
    counts = {"tools": len(corpus), "queries": len(queries)}
    for split, qrels in dataset.qrels.items():
        rows = ["query-id\tcorpus-id\tscore"] + [
            f"{q}\t{t}\t{s}" for q, rel in qrels.items() for t, s in rel.items()
        ]
        io.write_bytes(io.join(root, "qrels", f"{split}.tsv"), _lines(rows), storage_options)
        counts[f"{split}_queries"] = len(qrels)
    if dataset.scene_tool:
        rows = [f"{s}\t{t}" for s, tools in dataset.scene_tool.items() for t in tools]
        io.write_bytes(io.join(root, "scene_tool.txt"), _lines(rows), storage_options)
        for split, mapping in dataset.query_scene.items():
            rows = [f"{q}\t{s}" for q, s in mapping.items()]
            io.write_bytes(io.join(root, f"query_scene_{split}.txt"), _lines(rows), storage_options)
    if dataset.neg_queries:
        rows = [json.dumps(q, ensure_ascii=False) for q in dataset.neg_queries]
        io.write_bytes(io.join(root, NEG_QUERIES), _lines(rows), storage_options)
        counts["neg_queries"] = len(rows)
    io.write_bytes(io.join(root, "queries.jsonl"), _lines(queries), storage_options)
    return counts


def rewrite_beir(
    dataset: Dataset, root: str, source: str, storage_options: dict[str, Any] | None = None
) -> dict[str, int]:
    """:func:`write_beir` over a dataset in place, marked (:data:`REWRITING`) while it runs.

    ``source`` is a complete copy of ``dataset`` already written (a retrain's staged data): a
    rewrite that stops part-way leaves the mark naming it, the loader refuses the mixed dataset
    by name, and :func:`finish_rewrite` completes it from that copy (before, a ``data.strict``
    base stayed refused until its orphan rows were removed by hand).
    """
    mark = io.join(root, REWRITING)
    # Absolute: the next round may start from another working directory.
    where = source if io.is_remote(source) else os.path.abspath(io.local_path(source))
    io.write_bytes(mark, json.dumps({"from": where}).encode(), storage_options)
    counts = write_beir(dataset, root, storage_options)
    io.remove(mark, storage_options)
    return counts


def finish_rewrite(root: str, storage_options: dict[str, Any] | None = None) -> str | None:
    """Complete a :func:`rewrite_beir` of ``root`` that stopped part-way, from the copy its mark
    names (read with the same storage options); returns that copy, or ``None`` if none stopped.

    Raises:
        DatasetError: the copy the mark names cannot be read (removed since).
    """
    mark = io.join(root, REWRITING)
    if not io.exists(mark, storage_options):
        return None
    source = json.loads(io.read_bytes(mark, storage_options))["from"]
    try:
        # The copy is read with the dataset's own options: a copy staged on other storage (the
        # round's data.storage_options differed from retrain.data_out_storage_options) may refuse.
        dataset = load_dataset(source, storage_options=storage_options)
    except (DatasetError, OSError) as e:
        raise DatasetError(
            f"{mark}: a retrain stopped while rewriting {root}, and the complete copy it names, "
            f"{source}, cannot be read here ({e}); copy that copy over {root} and delete {mark}"
        ) from e
    rewrite_beir(dataset, root, source, storage_options)
    return source
