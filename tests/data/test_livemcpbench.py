"""LiveMCPBench through the MCP catalog reader: every tool, every resolvable task, ambiguity resolved."""

from __future__ import annotations

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
    # Every task keeps a judgement unless none of its tools is in the catalog.
    assert report["tasks"] == 94 and report["unmatched_mentions"] == 5
    data = load_dataset(str(tmp_path))
    assert len(data.corpus) == 527 and all(t.count("/") >= 1 for t in data.corpus)
    assert sum(len(r) for r in data.qrels["test"].values()) == report["judgements"]
