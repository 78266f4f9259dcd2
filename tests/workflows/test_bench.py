"""``toolscout bench`` keeps what it finished: the report is written after every entry."""

from __future__ import annotations

import json

import pytest

from workflows.bench import bench
from workflows.report import markdown_table, write_report


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


def test_bench_selects_on_valid_and_reads_test_for_the_selection_only(tiny_dataset, tmp_path, monkeypatch):
    import workflows.bench as bench_module

    scored: list[tuple[float, str]] = []
    real_score = bench_module.score

    def recording(method, dataset, split, ks=(1, 3, 5), *rest):
        metrics = real_score(method, dataset, split, ks, *rest)
        scored.append((method.config()["k1"], split))
        # Planted: the middle k1 is the best on valid, whatever the data says.
        metrics["ndcg@3"] = {0.5: 0.2, 1.2: 0.9, 2.0: 0.4}[method.config()["k1"]] if split == "valid" else 0.0
        return metrics

    monkeypatch.setattr(bench_module, "score", recording)
    cfg = {
        "data": {"path": str(tiny_dataset)},
        "train": {"storage_path": str(tmp_path / "runs")},
        "bench": {
            "out": str(tmp_path / "r.json"),
            "run": ["bm25"],
            "methods": {"bm25": {"method": "bm25", "grid": {"k1": [0.5, 1.2, 2.0]}}},
        },
    }
    report = bench(cfg)
    # Every combination on valid, then the valid winner's report rows; test once, for it alone.
    assert [s for k1, s in scored if s != "valid"] == ["test"]
    assert ("test" in [s for k1, s in scored if k1 != 1.2]) is False
    assert {r["split"]: r["config"]["k1"] for r in report["results"]} == {"valid": 1.2, "test": 1.2}


def test_a_method_s_scoring_variants_are_scored_on_valid_and_only_the_selected_one_on_test(
    ray_session, tiny_dataset, tmp_path
):
    from conftest import LOCAL_MODE, TINY_ENCODER

    cfg = {
        "data": {"path": str(tiny_dataset)},
        "train": {"storage_path": str(tmp_path / "runs"), "local_dir": str(tmp_path / "local"), **LOCAL_MODE},
        "bench": {
            "out": str(tmp_path / "r.json"),
            "run": ["dense"],
            "methods": {
                "dense": {
                    "method": "dense",
                    "params": {"encoder": TINY_ENCODER, "epochs": 1, "batch_size": 2},
                }
            },
        },
    }
    report = bench(cfg)
    rows = {(r["method"], r["split"]) for r in report["results"]}
    # Text tower, ID head and their mix, chosen on valid: the mix alone is read on test.
    assert {m for m, s in rows if s == "valid"} == {"dense_text", "dense_id", "dense_mixed"}
    assert {m for m, s in rows if s == "test"} == {"dense_mixed"}


def test_a_grid_value_given_alone_is_a_grid_of_one_and_an_empty_one_is_refused():
    from components.config import ConfigError
    from workflows.bench import expand_grid

    # A string was iterated character by character ("l", "u", ...), a number raised a TypeError.
    assert expand_grid({"profile": "lucene", "k1": 1.2}) == [{"profile": "lucene", "k1": 1.2}]
    assert expand_grid({"k1": [0.9, 1.2], "b": 0.75}) == [{"k1": 0.9, "b": 0.75}, {"k1": 1.2, "b": 0.75}]
    with pytest.raises(ConfigError, match=r"bench grid: \['k1'\] list no value"):
        expand_grid({"k1": [], "b": [0.4]})  # no combination: an assert failed after training


def test_the_selection_metric_must_be_a_ranking_metric():
    from components.config import ConfigError
    from workflows.bench import check_bench_metric

    check_bench_metric("ndcg@3")  # accepted
    for bad in ("queries", "ndcg@4", "accuracy"):  # a count, a cut-off not computed, not ranking
        with pytest.raises(ConfigError, match=r"bench\.select_metric: expected one of"):
            check_bench_metric(bad)


def test_a_report_without_a_value_is_strict_json(tmp_path):
    # A first retrain round has no champion: its NaN metrics were written as bare NaN, which jq,
    # JavaScript and strict parsers refuse.
    import json
    import math

    report = {
        "dataset": "d",
        "results": [
            {
                "method": "m",
                "config": {},
                "split": "valid",
                "metrics": {"ndcg@3": math.nan, "recall@3": 0.5, "p99_ms": math.inf},
            }
        ],
    }
    write_report(report, str(tmp_path / "r.json"), plot=False)

    def refuse(name):
        raise ValueError(name)

    back = json.loads((tmp_path / "r.json").read_text(), parse_constant=refuse)
    assert back["results"][0]["metrics"] == {"ndcg@3": None, "recall@3": 0.5, "p99_ms": None}
