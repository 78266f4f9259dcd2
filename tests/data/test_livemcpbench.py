"""LiveMCPBench through the MCP catalog reader: every tool, every resolvable task, ambiguity resolved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.data.livemcpbench import convert, resolve_task
from components.data.loader import load_dataset

LIVEMCPBENCH = Path(__file__).resolve().parents[2] / "../shared/datasets/livemcpbench"


def test_an_ambiguous_name_goes_to_the_server_holding_most_of_the_task():
    by_name = {
        "search": ["web/search", "files/search"],
        "read_file": ["files/read_file"],
        "fetch": ["web/fetch"],
    }
    assert resolve_task(["read_file", "search"], by_name) == (["files/read_file", "files/search"], [])
    assert resolve_task(["fetch", "search", "nope"], by_name) == (["web/fetch", "web/search"], ["nope"])
    # A tie goes to the first server in catalog order.
    assert resolve_task(["search"], by_name) == (["web/search"], [])


def test_the_real_catalog_converts_with_nothing_lost(tmp_path):
    if not (LIVEMCPBENCH / "tools.json").exists():
        pytest.skip(f"LiveMCPBench not found at {LIVEMCPBENCH.resolve()}")
    report = convert(str(LIVEMCPBENCH), str(tmp_path))
    assert report["tools"] == 527 and report["rejected_tools"] == 0
    assert report["mentions"] == 256 and report["ambiguous_mentions"] == 29
    # Every task keeps a judgement unless none of its tools is in the catalog: that one is a
    # reject with its line, not silently left out.
    assert report["tasks"] == 94 and report["unmatched_mentions"] == 5 and report["rejected_tasks"] == 1
    (dropped,) = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert dropped["reason"].startswith("no tool it names is in the catalog") and dropped["line"] > 0
    data = load_dataset(str(tmp_path))
    assert len(data.corpus) == 527 and all(t.count("/") >= 1 for t in data.corpus)
    assert sum(len(r) for r in data.qrels["test"].values()) == report["judgements"]


def test_a_bad_task_line_is_a_reject_with_its_file_and_line(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    weather = {"name": "weather", "description": "the forecast", "inputSchema": {"type": "object"}}
    (source / "tools.json").write_text(json.dumps([{"tools": {"srv": {"tools": [weather]}}}]))
    good = {"task_id": "t1", "question": "weather in Oslo", "tools": ["weather"]}
    lines = [json.dumps(good), '{"task_id": "t2", "tools": ["weather"]}', '{"task_id": "t3",']
    (source / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    report = convert(str(source), str(tmp_path / "out"))
    assert report["tasks"] == 1 and report["rejected_tasks"] == 2
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"].split(":")[0]) for r in rejects] == [
        (2, "not a task (JSON with task_id, question, tools)"),
        (3, "not a task (JSON with task_id, question, tools)"),
    ]


def test_a_server_listed_in_two_entries_is_written_once(tmp_path):
    # Both entries' tools were written: two corpus rows with one id, and serving kept the last.
    source = tmp_path / "src"
    source.mkdir()
    first = {"name": "search", "description": "first", "inputSchema": {"type": "object"}}
    second = {**first, "description": "second"}
    entries = [{"tools": {"srv": {"tools": [first]}}}, {"tools": {"srv": {"tools": [second]}}}]
    (source / "tools.json").write_text(json.dumps(entries))
    task = {"task_id": "t1", "question": "search the web", "tools": ["search"]}
    (source / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    report = convert(str(source), str(tmp_path / "out"))
    assert report["tools"] == 1 and report["rejected_tools"] == 1 and report["ambiguous_mentions"] == 0
    data = load_dataset(str(tmp_path / "out"))
    assert data.corpus["srv/search"]["metadata"]["description"] == "first"
    (reject,) = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert reject["line"] == 2 and "also in an earlier entry" in reject["reason"]
