"""``workflows.evaluate.score`` on a method whose rankings and detection probabilities are known."""

from __future__ import annotations

from typing import ClassVar

import pytest

from components.data.types import Dataset
from workflows.evaluate import score


class Known:
    """Ranks tool "a" first for every query; P(needs a tool) read from a table of texts."""

    capabilities: ClassVar[frozenset[str]] = frozenset({"detect"})
    detect_threshold = 0.5

    def __init__(self, probability: dict[str, float]) -> None:
        self.probability = probability

    def retrieve(self, queries, k):
        return {q: {"a": 2.0, "b": 1.0} for q in queries}

    def detect(self, queries):
        return {q: self.probability[text] for q, text in queries.items()}


def test_detection_is_scored_on_queries_that_need_a_tool_against_the_split_s_no_tool_queries():
    data = Dataset(
        name="t",
        corpus={"a": {}, "b": {}},
        queries={"q1": "book a flight", "q2": "flight status", "q3": "judged irrelevant only"},
        qrels={"valid": {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"a": 0}}},
        neg_split={"valid": ["hello there", "thanks"], "test": ["bye"]},
    )
    # q1 and one no-tool query are right at 0.5; q2 is missed; "thanks" is a false alarm.
    probability = {"book a flight": 0.9, "flight status": 0.2, "hello there": 0.1, "thanks": 0.7}
    m = score(Known(probability), data, "valid")
    assert m["recall@1"] == pytest.approx(0.5) and m["queries"] == 2  # q3 has no relevant tool
    # Positives q1, q2 (q3, judged irrelevant only, is neither); negatives: valid's two only.
    assert m["detect_accuracy"] == pytest.approx(2 / 4)
    assert m["detect_recall"] == pytest.approx(1 / 2) and m["detect_precision"] == pytest.approx(1 / 2)
    # AUROC over the 2 x 2 pairs: 0.9 beats both negatives, 0.2 beats only 0.1.
    assert m["detect_auroc"] == pytest.approx(3 / 4)


def test_test_unseen_is_also_scored_on_its_new_tools_alone():
    # q1 needs the new tool "n" and the seen "a"; q2 needs "b", which no training query needs (it
    # was only judged irrelevant there), so it is new too; the ranking is a, n, b for every query.
    data = Dataset(
        name="t",
        corpus={"a": {}, "b": {}, "n": {}},
        queries={"t1": "train", "q1": "flight and new tool", "q2": "other"},
        qrels={
            "train": {"t1": {"a": 1, "b": 0}},
            "test_unseen": {"q1": {"a": 1, "n": 1}, "q2": {"b": 1}},
        },
    )

    class Ranks(Known):
        def retrieve(self, queries, k):
            return {q: {"a": 3.0, "n": 2.0, "b": 1.0} for q in queries}

    m = score(Ranks({}), data, "test_unseen", ks=(1, 3))
    # Whole queries: q1 finds a at rank 1 (1 of 2), q2 misses b at rank 1.
    assert m["recall@1"] == pytest.approx((0.5 + 0.0) / 2) and m["queries"] == 2
    # New tools alone ("b" was judged 0 in train: no training edge, so it is new too):
    # q1 keeps {n} (rank 2), q2 keeps {b} (rank 3).
    assert m["new_queries"] == 2 and m["new_recall@1"] == 0.0
    assert m["new_recall@3"] == pytest.approx(1.0)
    assert "new_recall@1" not in score(Ranks({}), data, "train", ks=(1,))  # only test_unseen
