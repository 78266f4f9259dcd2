"""The seed comparison of a swept config with the hand-picked one (benchmarks/tune_seeds.py)."""

from __future__ import annotations

import pytest

from benchmarks.tune_seeds import SHOWN, check_shared, summary


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
