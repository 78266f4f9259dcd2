"""Read and validate a BEIR-layout dataset in parallel with Ray Data.

Each source file is read as bytes (local or s3://), exploded into numbered lines, and parsed by
the same row rules the in-process loader uses (:func:`components.data.loader.parse_file`), in
parallel batches. Whole-file checks then run once on the driver (:func:`assemble`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pandas as pd
import ray

from components.data import io
from components.data.loader import SourceFile, refuse_directory
from components.data.parse import Line
from components.data.rejects import DatasetError, Reject, RejectLog
from components.data.resolve import parse_lines

_EMPTY = -1  # line number marking an empty file
_META = 0  # line number of the per-file row carrying its hash and size


def explode(row: dict, sources: dict[str, SourceFile]) -> Iterator[dict]:
    """One file's bytes -> a meta row, then one row per line (decoding happens per line later)."""
    path = row["path"]
    rel = next(r for r in sources if path.endswith("/" + r) or path == r)
    data: bytes = row["bytes"]
    meta = json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)})
    yield {"rel": rel, "kind": sources[rel].kind, "line": _META, "raw": meta.encode()}
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if not data.strip():
        yield {"rel": rel, "kind": sources[rel].kind, "line": _EMPTY, "raw": b""}
        return
    for number, raw in enumerate(data.split(b"\n"), start=1):
        yield {"rel": rel, "kind": sources[rel].kind, "line": number, "raw": raw.rstrip(b"\r")}


def parse_batch(batch: pd.DataFrame) -> pd.DataFrame:
    """Parse a batch of lines with the shared row rules; values travel as JSON strings."""
    out = []
    for (rel, kind), group in batch.groupby(["rel", "kind"], sort=False):
        special = group[group["line"] <= _META]
        out += [
            {"rel": rel, "line": int(r.line), "value": r.raw.decode(), "reason": ""}
            for r in special.itertuples()
        ]
        lines = []
        for r in group[group["line"] > _META].itertuples():
            try:
                text: str | None = r.raw.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            lines.append(Line(int(r.line), text, r.raw))
        rows, rejects = parse_lines(kind, rel, lines)
        out += [{"rel": rel, "line": n, "value": json.dumps(v), "reason": ""} for n, v in rows]
        out += [{"rel": rel, "line": j.line, "value": j.content, "reason": j.reason} for j in rejects]
    return pd.DataFrame(out, columns=["rel", "line", "value", "reason"])


def _restore(kind: str, value: Any) -> Any:
    """JSON turns tuples into lists; the resolvers expect the parser's tuples back."""
    return tuple(value) if kind in ("qrels", "pairs") else value


def ingest(
    root: str,
    sources: list[SourceFile],
    log: RejectLog,
    storage_options: dict[str, Any] | None = None,
    parallelism: int = 8,
) -> tuple[dict[str, list], dict[str, dict]]:
    """Parse every source file in parallel; returns rows by relative path and per-file hashes."""
    by_rel = {s.rel: s for s in sources}
    for rel in by_rel:  # Ray would read a directory's parts as files
        refuse_directory(io.join(root, rel), storage_options)
    ds = ray.data.read_binary_files(
        [io.join(root, s.rel) for s in sources],
        include_paths=True,
        filesystem=io.arrow_filesystem(root, storage_options),
    )
    ds = ds.flat_map(explode, fn_kwargs={"sources": by_rel})
    ds = ds.repartition(parallelism).map_batches(parse_batch, batch_format="pandas", batch_size=4096)
    rows: dict[str, list] = {s.rel: [] for s in sources}
    inputs: dict[str, dict] = {}
    for batch in ds.iter_batches(batch_format="pandas", batch_size=None):
        for r in batch.itertuples():
            if r.line == _META:
                inputs[r.rel] = json.loads(r.value)
            elif r.line == _EMPTY:
                raise DatasetError(f"{io.join(root, r.rel)}: file is empty; expected one record per line")
            elif r.reason:
                log.extend([Reject(r.rel, int(r.line), r.reason, r.value)])
            else:
                rows[r.rel].append((int(r.line), _restore(by_rel[r.rel].kind, json.loads(r.value))))
    return rows, inputs
