"""The retrain decision's counts of what an increment added, split by where the merge put it."""

from __future__ import annotations

from components.data.types import Dataset
from workflows.retrain.increment import Increment, merge


def base() -> Dataset:
    return Dataset(
        name="base",
        corpus={"t1": {"text": "weather"}, "t2": {"text": "maps"}},
        queries={"q1": "what is the weather", "q2": "show me a map"},
        qrels={"train": {"q2": {"t2": 1.0}}, "valid": {"q1": {"t1": 1.0}}},
    )


def test_a_training_query_moved_to_the_holdout_is_counted_there():
    # A train-only increment: "What is the weather?" repeats holdout request q1 and joins valid.
    inc = Increment(
        queries={"n1": "What is the weather?", "n2": "route to the station"},
        qrels={"train": {"n1": {"t1": 1.0}, "n2": {"t2": 1.0}}},
    )
    merged = merge(base(), inc)
    assert "n1" in merged.qrels["valid"]
    counts = inc.counts(base(), merged)
    # Before: only the increment's own splits were counted, so n1 was counted nowhere.
    assert counts["train_judged_queries"] == 1
    assert counts["valid_judged_queries"] == 1
    assert counts["new_queries"] == 2


def test_without_the_merge_each_split_counts_the_increments_own_judgements():
    inc = Increment(
        queries={"n1": "What is the weather?"},
        qrels={"train": {"n1": {"t1": 1.0}}},
    )
    counts = inc.counts(base())
    assert counts["train_judged_queries"] == 1 and "valid_judged_queries" not in counts
