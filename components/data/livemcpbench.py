"""LiveMCPBench (icip-cas/LiveMCPBench) as a BEIR dataset: a real MCP catalog and its tasks.

``tools.json`` lists 70 MCP servers with their ``tools/list`` answers; each server's tools go
through :func:`components.data.mcp_catalog.corpus_records`, the reader ``toolscout ingest mcp``
uses for live servers, with the server key of its config as the server name (ids
``<server>/<tool>``). ``tasks.jsonl`` holds 95 multi-tool tasks naming the tools the annotators used;
they become ``queries.jsonl`` and ``qrels/test.tsv`` (there is no training data: zero-shot only).

A tool name that more than one server has (29 of 256 mentions) is resolved to one server: the
server that holds the most of the task's other tool names, then the first in catalog order. A name
no server has is left out of the task's judgements and counted in the conversion report.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from components.data import io
from components.data.mcp_catalog import corpus_records
from components.data.rejects import RejectLog


def read_servers(path: str, rejects: RejectLog) -> list[dict[str, Any]]:
    """Corpus records of every server in ``tools.json``, in file order."""
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    file = os.path.basename(path)
    for number, entry in enumerate(entries, start=1):
        for server_key, listing in (entry.get("tools") or {}).items():
            for record in corpus_records(server_key, listing.get("tools") or [], rejects, file):
                # A server key in two entries: both were written, two rows with one id.
                if record["_id"] in seen:
                    reason = f"tool id {record['_id']!r} is also in an earlier entry (the first is kept)"
                    rejects.add(file, number, reason, record["_id"])
                else:
                    seen.add(record["_id"])
                    records.append(record)
    return records


def resolve_task(names: list[str], by_name: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """The task's tool ids, one per distinct known name, and the names no server has."""
    known = [n for n in dict.fromkeys(names) if n in by_name]
    missing = [n for n in dict.fromkeys(names) if n not in by_name]
    votes = Counter(tid.split("/", 1)[0] for n in known for tid in by_name[n])
    ids = []
    for name in known:
        candidates = by_name[name]  # catalog order
        ids.append(max(candidates, key=lambda tid: (votes[tid.split("/", 1)[0]], -candidates.index(tid))))
    return ids, missing


def convert(source_dir: str, out_dir: str) -> dict[str, Any]:
    """Write ``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv`` (and rejects) under ``out_dir``.

    Returns a report: tools, tasks, mentions, ambiguous and unmatched mentions, rejects.
    """
    rejects = RejectLog()
    records = read_servers(os.path.join(source_dir, "tools.json"), rejects)
    by_name: dict[str, list[str]] = {}
    for r in records:
        by_name.setdefault(r["metadata"]["name"], []).append(r["_id"])
    queries, qrels, mentions, ambiguous, unmatched = [], [], 0, 0, Counter()
    tasks_file = os.path.join(source_dir, "tasks.jsonl")
    with open(tasks_file, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
                qid, question = str(task["task_id"]), str(task["question"])
                names = list(task.get("tools") or [])
            except (ValueError, KeyError, TypeError) as e:  # each bad task said, with its line
                why = f"not a task (JSON with task_id, question, tools): {type(e).__name__}: {e}"
                rejects.add(tasks_file, number, why, line.strip())
                continue
            mentions += len(names)
            ambiguous += sum(len(by_name.get(n, [])) > 1 for n in names)
            ids, missing = resolve_task(names, by_name)
            unmatched.update(missing)
            if not ids:  # nothing to judge it against: kept out, and said why
                rejects.add(tasks_file, number, f"no tool it names is in the catalog: {names}", line.strip())
                continue
            queries.append({"_id": qid, "text": question, "metadata": {"category": task.get("category")}})
            qrels += [(qid, tid) for tid in ids]
    io.write_jsonl(os.path.join(out_dir, "corpus.jsonl"), records)
    io.write_jsonl(os.path.join(out_dir, "queries.jsonl"), queries)
    tsv = "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{t}\t1\n" for q, t in qrels)
    io.write_bytes(os.path.join(out_dir, "qrels", "test.tsv"), tsv.encode())
    rejects.write(os.path.join(out_dir, "rejects.jsonl"))
    return {
        "tools": len(records),
        "tasks": len(queries),
        "judgements": len(qrels),
        "mentions": mentions,
        "ambiguous_mentions": ambiguous,
        "unmatched_mentions": sum(unmatched.values()),
        "unmatched_names": sorted(unmatched),
        "rejected_tools": sum(r.file != tasks_file for r in rejects.rejects),
        "rejected_tasks": sum(r.file == tasks_file for r in rejects.rejects),
    }
