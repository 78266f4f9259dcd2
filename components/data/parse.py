"""Row-level parsing and validation, shared by the in-process loader and the Ray Data pipeline.

Every function here looks at one line and returns either a parsed value or a reject reason, so the
same rules run on a laptop and in parallel on a cluster. Checks that need the whole file
(duplicates, references between files) live in :mod:`components.data.resolve`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

QRELS_HEADER = ("query-id", "corpus-id", "score")
INTEGER = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class Line:
    """One physical line of an input file (1-based ``number``); ``text`` is None if it is not UTF-8."""

    number: int
    text: str | None
    raw: bytes


def split_lines(data: bytes) -> Iterator[Line]:
    """Split file bytes into lines, decoding each as UTF-8 on its own.

    Decoding per line means one bad byte costs one row, not the file. A UTF-8 byte-order mark on
    the first line is dropped (editors on Windows write one).
    """
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    for i, raw in enumerate(data.split(b"\n"), start=1):
        raw = raw.rstrip(b"\r")
        try:
            text: str | None = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        yield Line(i, text, raw)


def raw_repr(line: Line) -> str:
    """The row as text for the reject file, with undecodable bytes escaped rather than lost."""
    return line.text if line.text is not None else line.raw.decode("utf-8", errors="backslashreplace")


def breaks_rows(ident: str) -> bool:
    """Whether an id holds a tab or line break: qrels rows are tab-separated lines, so no row
    could name it (the loader rejects it, and ingest must not write it)."""
    return any(c in ident for c in "\t\n\r")


def parse_record(text: str) -> tuple[dict | None, str | None]:
    """Parse a ``corpus.jsonl`` / ``queries.jsonl`` row.

    Returns:
        ``(record, None)`` with ``_id`` and ``text`` as strings, or ``(None, reason)``.
    """
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"malformed JSON: {e.msg} at column {e.colno}"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    if "_id" not in obj:
        return None, "missing field '_id'"
    rid = obj["_id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or str(rid).strip() == "":
        return None, f"'_id' must be a non-empty string or integer, got {rid!r}"
    if breaks_rows(str(rid)):
        return None, f"'_id' must not contain a tab or line break, got {rid!r}"
    if "text" not in obj:
        return None, "missing field 'text'"
    body = obj["text"]
    if not isinstance(body, str):
        return None, f"'text' must be a string, got {type(body).__name__}"
    if not body.strip():
        return None, "empty 'text'"
    title = obj.get("title", "")
    if title is None:
        title = ""
    if not isinstance(title, str):
        return None, f"'title' must be a string, got {type(title).__name__}"
    metadata = obj.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        return None, f"'metadata' must be an object, got {type(metadata).__name__}"
    for field, value in (("_id", str(rid)), ("title", title), ("text", body), ("metadata", metadata)):
        problem = not_utf8(value)
        if problem:
            return None, f"'{field}' {problem}"
    return {"_id": str(rid).strip(), "title": title, "text": body, "metadata": metadata}, None


def not_utf8(value: Any) -> str | None:
    """Why ``value`` (a string, or JSON data) cannot be written as UTF-8, or None.

    JSON's ``\\ud83d`` escape alone (half of an emoji, common in scraped text) decodes to a lone
    surrogate: Python keeps it, but Arrow, Parquet and UTF-8 files cannot hold it.
    """
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"holds an unpaired surrogate {text[e.start]!r} at character {e.start}: not valid UTF-8"
    return None


def is_qrels_header(text: str) -> bool:
    """Whether a qrels line is the BEIR header ``query-id corpus-id score``."""
    return tuple(text.strip().split("\t")) == QRELS_HEADER or tuple(text.split()) == QRELS_HEADER


def parse_qrels_row(text: str) -> tuple[tuple[str, str, int] | None, str | None]:
    """Parse a ``qrels/<split>.tsv`` row ``query-id<TAB>corpus-id<TAB>score``."""
    cols = text.split("\t")
    if len(cols) != 3:
        return None, f"expected 3 tab-separated columns (query-id, corpus-id, score), got {len(cols)}"
    qid, tid, score = (c.strip() for c in cols)
    if not qid or not tid:
        return None, "empty query-id or corpus-id"
    # ASCII digits only: int() also takes "1_0" (ten) and other scripts' digits, so a typo would
    # load as another relevance instead of being rejected.
    if not INTEGER.fullmatch(score):
        return None, f"score must be an integer, got {score!r}"
    value = int(score)
    if value < 0:
        return None, f"score must be >= 0, got {value}"
    return (qid, tid, value), None


def parse_id_pair(text: str) -> tuple[tuple[str, str] | None, str | None]:
    """Parse a two-column id map line (``query_scene_*.txt``, ``scene_tool.txt``, ``query_tool*.txt``).

    Tab-separated when the line has a tab (what :func:`components.data.beir.write_beir` writes, and
    the only way to keep an id with a space, such as an MCP tool ``srv/get weather``: split on any
    whitespace, its rows were rejected and a retrain rewriting its base lost them); else split on
    whitespace, as the ToolLens files are."""
    stripped = text.strip()
    cols = [c.strip() for c in stripped.split("\t")] if "\t" in stripped else stripped.split()
    if len(cols) != 2 or not all(cols):
        sep = "tab" if "\t" in stripped else "whitespace"
        return None, f"expected 2 {sep}-separated ids, got {len(cols)} column(s)"
    return (cols[0], cols[1]), None


def parse_neg_query(text: str) -> tuple[str | None, str | None]:
    """Parse a no-tool query line: a JSON string, or an object with ``text``."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"malformed JSON: {e.msg} at column {e.colno}"
    if isinstance(obj, dict):
        obj = obj.get("text")
    if not isinstance(obj, str):
        return None, "expected a JSON string or an object with a string 'text'"
    if not obj.strip():
        return None, "empty query"
    problem = not_utf8(obj)
    if problem:
        return None, f"query {problem}"
    return obj, None
