"""The BM25 reproduction sweep: its settings, gaps to the published row and its summary table."""

from __future__ import annotations

import pytest

from benchmarks.bm25_reproduction import (
    PUBLISHED,
    TOLERANCE,
    markdown,
    max_gap,
    score_setting,
    settings,
    summary,
)
from components.data import open_dataset
from components.methods.bm25.method import BM25Method


def _row(split: str, r3: float, ndcg3: float = 0.2319, tokenizer: str = "whitespace") -> dict:
    metrics = {**PUBLISHED, "recall@3": r3, "ndcg@3": ndcg3}
    config = {"tokenizer": tokenizer, "stopwords": "english", "stemmer": "none", "fields": "raw"}
    config |= {"variant": "lucene", "k1": 1.2, "b": 0.75}
    return {
        "method": "bm25",
        "config": config,
        "split": split,
        "metrics": {**metrics, "max_gap": max_gap(metrics)},
    }


def test_every_setting_is_distinct_and_builds_a_method():
    all_settings = settings()
    assert len(all_settings) == 1800
    assert len({repr(s) for s in all_settings}) == len(all_settings)
    for kwargs in all_settings[:: len(all_settings) // 20]:
        BM25Method("lucene", **kwargs)  # raises on an unknown part


def test_max_gap_is_the_largest_absolute_difference():
    assert max_gap(PUBLISHED) == 0
    assert max_gap({**PUBLISHED, "recall@5": PUBLISHED["recall@5"] - 0.01}) == pytest.approx(0.01)


def test_summary_counts_within_tolerance_and_picks_on_valid_not_test():
    # setting 0 matches the published row on test; setting 1 misses it but wins on valid
    test = [_row("test", 0.2158), _row("test", 0.30, tokenizer="lucene")]
    valid = [_row("valid", 0.2, ndcg3=0.20), _row("valid", 0.3, ndcg3=0.30, tokenizer="lucene")]
    summ = summary(valid, test)
    assert summ["within"]["all four"] == 1 and summ["within"]["recall@3"] == 1
    assert summ["closest"][0] is test[0]
    assert summ["valid_pick"] == (valid[1], test[1])
    table = markdown(summ, {"colt": PUBLISHED})
    assert "best valid N@3: lucene/english/none raw lucene k1=1.2 b=0.75 | 0.3000" in table
    assert f"Within ±{TOLERANCE}" in table


def test_score_setting_reads_valid_and_test(tiny_dataset):
    dataset = open_dataset(str(tiny_dataset))
    scores = score_setting(BM25Method("colt"), dataset)
    assert set(scores) == {"valid", "test"}
    for split in ("valid", "test"):  # each split's own queries, every one with a relevant tool
        assert scores[split]["queries"] == len(dataset.qrels[split]) > 0
    assert scores["valid"] != scores["test"]


def test_main_writes_the_report(tiny_dataset, tmp_path, monkeypatch):
    import json
    import sys

    from benchmarks import bm25_reproduction

    monkeypatch.setattr(bm25_reproduction, "settings", lambda: settings()[:3])
    out = tmp_path / "repro.json"
    monkeypatch.setattr(
        sys, "argv", ["bm25_reproduction", "--toollens", str(tiny_dataset), "--out", str(out)]
    )
    bm25_reproduction.main()
    report = json.loads(out.read_text())
    assert report["summary"]["settings"] == 3
    assert [r["split"] for r in report["results"]] == ["test"] * 3 + ["valid"]
    assert "profile `colt`" in (tmp_path / "repro.md").read_text()
