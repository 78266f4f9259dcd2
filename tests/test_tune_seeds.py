"""The seed comparison of a swept config with the hand-picked one (benchmarks/tune_seeds.py)."""

from __future__ import annotations

import pytest

from benchmarks.tune_seeds import (
    PER_QUERY,
    SHOWN,
    bootstrap_table,
    check_shared,
    fingerprint,
    query_bootstrap,
    summary,
)


def run(label: str, seed: int, split_values: dict[str, float]) -> dict:
    """One finished run as runs.jsonl keeps it: every shown metric set to its split's value."""
    rows = [{"split": s, "metrics": dict.fromkeys(SHOWN, v)} for s, v in split_values.items()]
    return {"label": label, "seed": seed, "train_seconds": 1.0, "rows": rows}


def test_paired_differences_are_selected_minus_baseline_at_the_same_seed():
    runs = [
        run("base", 0, {"valid": 0.50, "test": 0.40}),
        run("tuned", 0, {"valid": 0.55, "test": 0.41}),
        run("base", 1, {"valid": 0.60, "test": 0.50}),
        run("tuned", 1, {"valid": 0.58, "test": 0.53}),
        run("tuned", 2, {"valid": 0.90, "test": 0.90}),  # no baseline at seed 2: not paired
    ]
    s = summary(runs, ["base", "tuned"], "test")
    assert s["seeds"] == [0, 1]
    paired = s["paired"]["recall@3"]
    assert paired["by_seed"] == pytest.approx([0.01, 0.03])
    assert paired["mean"] == pytest.approx(0.02)
    assert (paired["above"], paired["below"]) == (2, 0)
    assert s["configs"]["tuned"]["ndcg@3"]["mean"] == pytest.approx(0.47)
    assert s["configs"]["base"]["ndcg@3"]["sd"] == pytest.approx(0.0707107, abs=1e-6)
    valid = summary(runs, ["base", "tuned"], "valid")["paired"]["ndcg@3"]
    assert (valid["above"], valid["below"]) == (1, 1)


MASSTOOL = {"semantic_cache": "cache", "epochs": 2, "lr": 1e-3, "epsilon": 0.5}


def test_a_shared_stage_both_configs_train_alike_is_accepted():
    # The joint stage's settings differ; the semantic stage's do not.
    check_shared({"a": ("masstool", MASSTOOL), "b": ("masstool", {**MASSTOOL, "lr": 5e-3})}, ["semantic"], 0)


def test_a_shared_stage_the_configs_train_differently_is_refused():
    other = {**MASSTOOL, "semantic": {"epochs": 5}}
    with pytest.raises(SystemExit, match="train it differently"):
        check_shared({"a": ("masstool", MASSTOOL), "b": ("masstool", other)}, ["semantic"], 0)


def test_a_shared_stage_the_method_lacks_is_refused():
    with pytest.raises(SystemExit, match="no stage 'memorization'"):
        check_shared({"a": ("masstool", MASSTOOL)}, ["memorization"], 0)


def with_queries(label: str, seed: int, values: dict[str, float]) -> dict:
    """A run whose test split holds per-query values: ``values`` for R@3, each minus 0.5 for N@3."""
    r = run(label, seed, {"valid": 0.5, "test": 0.5})
    r["per_query"] = {"test": {"recall@3": values, "ndcg@3": {q: v - 0.5 for q, v in values.items()}}}
    return r


def test_the_query_bootstrap_averages_each_query_over_the_seeds_before_pairing():
    queries = [f"q{i}" for i in range(40)]
    runs = [
        with_queries("base", 0, dict.fromkeys(queries, 0.5)),
        with_queries("base", 1, dict.fromkeys(queries, 0.5)),
        # +0.2 on every query at seed 0, level at seed 1: +0.1 per query once averaged.
        with_queries("tuned", 0, dict.fromkeys(queries, 0.7)),
        with_queries("tuned", 1, dict.fromkeys(queries, 0.5)),
    ]
    boot = query_bootstrap(runs, ["base", "tuned"], "test")
    assert boot is not None and boot["seeds"] == [0, 1]
    for metric in PER_QUERY:
        assert boot[metric]["mean"] == pytest.approx(0.1)
        assert boot[metric]["low"] == pytest.approx(0.1) and boot[metric]["queries"] == 40
    assert "| test | recall@3 | 2 | +0.1000 |" in bootstrap_table({"test": boot}, ["base", "tuned"])


def test_the_query_bootstrap_interval_covers_zero_when_gains_and_losses_cancel():
    queries = [f"q{i}" for i in range(200)]
    base = dict.fromkeys(queries, 0.5)
    tuned = {q: 0.5 + (0.3 if i % 2 else -0.3) for i, q in enumerate(queries)}
    boot = query_bootstrap(
        [with_queries("base", 0, base), with_queries("tuned", 0, tuned)], ["base", "tuned"], "test"
    )
    r = boot["recall@3"]
    assert r["mean"] == pytest.approx(0.0, abs=1e-12) and r["low"] < 0 < r["high"]


def test_no_query_bootstrap_when_a_paired_run_kept_no_per_query_values():
    runs = [with_queries("base", 0, {"q": 1.0}), run("tuned", 0, {"valid": 0.5, "test": 0.5})]
    assert query_bootstrap(runs, ["base", "tuned"], "test") is None
    assert bootstrap_table({"test": None}, ["base", "tuned"]) == ""


def test_a_trained_run_keeps_per_query_values_that_average_to_its_split_scores(tiny_dataset, tmp_path):
    from benchmarks.tune_seeds import train_and_score
    from components.data import open_dataset
    from workflows.bench import report_splits

    data = open_dataset(str(tiny_dataset))
    cfg = {"train": {"storage_path": str(tmp_path / "runs")}}
    out = train_and_score(cfg, "bm25", "bm25", {}, 3, [], data)
    assert [r["split"] for r in out["rows"]] == report_splits(data) == list(out["per_query"])
    for row in out["rows"]:
        values = out["per_query"][row["split"]]
        for metric in PER_QUERY:
            assert set(values[metric]) == set(data.qrels[row["split"]])  # every judged query
            mean = sum(values[metric].values()) / len(values[metric])
            assert mean == pytest.approx(row["metrics"][metric])


def test_a_cached_run_is_reused_only_for_the_settings_it_trained():
    # Runs were matched on label and seed alone: a changed config (or another -c) reused the runs
    # of other settings under the same entry name.
    cfg = {"data": {"path": "d"}, "splits": {"valid_fraction": 0.1}}
    base = fingerprint(cfg, "masstool", {"lr": 1e-3}, ["semantic"])
    assert base == fingerprint(dict(cfg), "masstool", {"lr": 1e-3}, ["semantic"])
    assert base != fingerprint(cfg, "masstool", {"lr": 2e-3}, ["semantic"])
    assert base != fingerprint({**cfg, "data": {"path": "other"}}, "masstool", {"lr": 1e-3}, ["semantic"])
    assert base != fingerprint(cfg, "masstool", {"lr": 1e-3}, [])
