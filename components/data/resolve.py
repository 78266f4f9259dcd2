"""Whole-file checks: line parsing with reject logging, duplicates, and references between files.

The loader and the Ray Data pipeline both call these, so a dataset validates the same way in one
process and on a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from components.data.parse import (
    Line,
    is_qrels_header,
    parse_id_pair,
    parse_neg_query,
    parse_qrels_row,
    parse_record,
    raw_repr,
)
from components.data.rejects import DatasetError, Reject, RejectLog, clipped
from components.data.types import Corpus, Qrels

KINDS = ("records", "qrels", "pairs", "neg")
_PARSERS = {
    "records": parse_record,
    "qrels": parse_qrels_row,
    "pairs": parse_id_pair,
    "neg": parse_neg_query,
}


def parse_lines(kind: str, file: str, lines: Iterable[Line]) -> tuple[list[tuple[int, Any]], list[Reject]]:
    """Parse lines of one file of the given kind into ``(line number, value)`` rows and rejects.

    Blank lines carry no data and are skipped; a qrels header on line 1 is skipped.
    """
    parser = _PARSERS[kind]
    rows: list[tuple[int, Any]] = []
    rejects: list[Reject] = []
    for line in lines:
        if line.text is None:
            rejects.append(Reject(file, line.number, "not valid UTF-8", clipped(raw_repr(line))))
            continue
        if not line.text.strip():
            continue
        if kind == "qrels" and line.number == 1 and is_qrels_header(line.text):
            continue
        value, reason = parser(line.text)
        if reason is not None:
            rejects.append(Reject(file, line.number, reason, clipped(raw_repr(line))))
        else:
            rows.append((line.number, value))
    return rows, rejects


def require_rows(file: str, rows: list, what: str) -> None:
    """Fail clearly when a required file has no usable row."""
    if not rows:
        raise DatasetError(f"{file}: no valid rows; expected {what}")


def resolve_records(file: str, rows: list[tuple[int, dict]], log: RejectLog) -> dict[str, dict]:
    """Index records by ``_id``; a repeated id is rejected and the first occurrence kept."""
    out: dict[str, dict] = {}
    first_line: dict[str, int] = {}
    for number, rec in sorted(rows, key=lambda r: r[0]):
        rid = rec["_id"]
        if rid in out:
            reason = f"duplicate _id {rid!r} (first at line {first_line[rid]})"
            log.add(file, number, reason, json.dumps(rec, ensure_ascii=False))
            continue
        out[rid] = rec
        first_line[rid] = number
    return out


def resolve_qrels(
    file: str,
    rows: list[tuple[int, tuple[str, str, int]]],
    queries: dict[str, Any],
    corpus: Corpus,
    log: RejectLog,
) -> Qrels:
    """Build a qrels dict, rejecting rows that name unknown queries or tools.

    An identical repeated pair carries no new information: it is merged and counted in
    ``log.notes``. A repeated pair with a different score is a conflict and is rejected.
    """
    qrels: Qrels = {}
    for number, (qid, tid, score) in sorted(rows, key=lambda r: r[0]):
        content = f"{qid}\t{tid}\t{score}"
        if qid not in queries:
            log.add(file, number, f"unknown query-id {qid!r} (not in queries.jsonl)", content)
        elif tid not in corpus:
            log.add(file, number, f"unknown corpus-id {tid!r} (not in corpus.jsonl)", content)
        elif tid in qrels.get(qid, {}):
            if qrels[qid][tid] == score:
                log.note(f"{file}: merged duplicate pairs")
            else:
                log.add(
                    file, number, f"conflicting score for pair ({qid}, {tid}): {qrels[qid][tid]}", content
                )
        else:
            qrels.setdefault(qid, {})[tid] = score
    return qrels


def resolve_pairs(
    file: str,
    rows: list[tuple[int, tuple[str, str]]],
    left: Iterable[str] | None,
    right: Iterable[str] | None,
    names: tuple[str, str],
    log: RejectLog,
) -> list[tuple[str, str]]:
    """Keep id pairs whose ids exist on both sides (``None`` skips a side's check)."""
    left_set = set(left) if left is not None else None
    right_set = set(right) if right is not None else None
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for number, (a, b) in sorted(rows, key=lambda r: r[0]):
        if left_set is not None and a not in left_set:
            log.add(file, number, f"unknown {names[0]} {a!r}", f"{a}\t{b}")
        elif right_set is not None and b not in right_set:
            log.add(file, number, f"unknown {names[1]} {b!r}", f"{a}\t{b}")
        elif (a, b) in seen:
            log.note(f"{file}: merged duplicate pairs")
        else:
            seen.add((a, b))
            out.append((a, b))
    return out
