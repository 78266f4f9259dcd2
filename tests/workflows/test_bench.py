"""``toolscout bench`` keeps what it finished: the report is written after every entry."""

from __future__ import annotations

import json

import pytest

from workflows.bench import bench
from workflows.report import markdown_table


def test_an_interrupted_bench_keeps_the_entries_it_finished(tiny_dataset, tmp_path):
    out = tmp_path / "r.json"
    cfg = {
        "data": {"path": str(tiny_dataset)},
        "train": {"storage_path": str(tmp_path / "runs")},
        "bench": {
            "out": str(out),
            "run": ["bm25", "broken"],
            "methods": {"bm25": {"method": "bm25"}, "broken": {"method": "bm25", "params": {"k9": 1}}},
        },
    }
    with pytest.raises((TypeError, ValueError)):
        bench(cfg)
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["entries_done"] == ["bm25"]
    assert {r["method"] for r in report["results"]} == {"bm25"}
    assert "Partial: 1 of 2 entries finished." in out.with_suffix(".md").read_text()
    # Every row says where it trained.
    assert all(r["device"].startswith("cpu (") for r in report["results"])


def test_the_table_shows_memory_and_device_where_rows_have_them():
    row = {"method": "m", "split": "test", "metrics": {"recall@3": 0.5}, "train_seconds": 2.0}
    report = {"results": [row | {"peak_memory_mb": 812.25, "device": "NVIDIA H100 80GB HBM3"}, row]}
    lines = markdown_table(report).splitlines()
    assert lines[0].split("|")[-4:-1] == [" train_seconds ", " peak_memory_mb ", " device "]
    assert "| 812.2 | NVIDIA H100 80GB HBM3 |" in lines[2] and lines[3].endswith("| 2.0 |  |  |")
