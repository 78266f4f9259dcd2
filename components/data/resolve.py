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
from components.data.splits import same_request
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


def one_scene_per_query(
    rel: str, rows: list[tuple[int, tuple[str, str]]], pairs: list[tuple[str, str]], log: RejectLog
) -> dict[str, str]:
    """Each query's scene; a query given a second, different scene keeps its first and the later
    line is rejected (a scene decides which tools co-occur, so two cannot both be right)."""
    kept = set(pairs)
    scene: dict[str, str] = {}
    for number, (qid, sid) in sorted(rows, key=lambda r: r[0]):
        if (qid, sid) not in kept:
            continue  # rejected or merged by resolve_pairs already
        if qid in scene and scene[qid] != sid:
            log.add(rel, number, f"query-id {qid!r} already has scene {scene[qid]!r}", f"{qid}\t{sid}")
        else:
            scene.setdefault(qid, sid)
    return scene


def not_tool_queries(
    file: str, rows: list[tuple[int, str]], queries: dict[str, str], log: RejectLog
) -> list[tuple[int, str]]:
    """The no-tool ``(line, text)`` rows that are not a tool query's request (text equal up to case,
    punctuation and spacing to a ``queries.jsonl`` text); those that are are rejected with the query
    they repeat. One request labelled both "needs a tool" and "needs none" would train the detector
    on a contradiction and score it on one, and could put the same text in two splits."""
    tool_requests: dict[str, str] = {}
    for qid, text in queries.items():
        tool_requests.setdefault(same_request(text), qid)
    kept = []
    for number, text in rows:
        qid = tool_requests.get(same_request(text))
        if qid is None:
            kept.append((number, text))
        else:
            reason = f"the same request as query-id {qid!r} in queries.jsonl, a tool query"
            log.add(file, number, reason, json.dumps(text, ensure_ascii=False))
    return kept


def unique_texts(file: str, rows: list[tuple[int, str]], log: RejectLog) -> list[str]:
    """The texts of ``(line, text)`` rows in line order, each once; repeats are counted in the notes.

    A repeated no-tool query adds no information, and keeping copies would weight it more in
    training and in the detection metrics.
    """
    seen: set[str] = set()
    out = []
    for _, text in rows:
        if text not in seen:
            seen.add(text)
            out.append(text)
    if len(out) < len(rows):
        log.note(f"{file}: dropped repeated texts (first kept)", len(rows) - len(out))
    return out
