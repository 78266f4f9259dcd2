"""Retrieval and detection metrics against hand-computed values."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest

from components.metrics import (
    auroc,
    detection_metrics,
    evaluate_retrieval,
    query_metrics,
    ranked,
    score_detection,
)

L3 = 1 / math.log2(3)  # 0.6309: discount at rank 2
L5 = 1 / math.log2(5)  # 0.4307: discount at rank 4

# qa: two relevant tools ranked 2nd and 4th; qb: one relevant tool ranked 1st;
# qc: three relevant tools, only two returned, ranked 1st and 2nd.
QRELS = {
    "qa": {"a": 1, "b": 1},
    "qb": {"c": 1},
    "qc": {"d": 1, "e": 2, "f": 1},
}
RESULTS = {
    "qa": {"x": 0.9, "a": 0.8, "y": 0.7, "b": 0.6, "z": 0.5},
    "qb": {"c": 1.0, "x": 0.5},
    "qc": {"d": 0.5, "e": 0.4},
}

# Hand-computed per-query values: (recall, ndcg, comp, precision, mrr).
EXPECTED = {
    ("qa", 1): (0.0, 0.0, 0.0, 0.0, 0.0),
    ("qa", 3): (1 / 2, L3 / (1 + L3), 0.0, 1 / 3, 1 / 2),
    ("qa", 5): (1.0, (L3 + L5) / (1 + L3), 1.0, 2 / 5, 1 / 2),
    ("qb", 1): (1.0, 1.0, 1.0, 1.0, 1.0),
    ("qb", 3): (1.0, 1.0, 1.0, 1 / 3, 1.0),
    ("qb", 5): (1.0, 1.0, 1.0, 1 / 5, 1.0),
    ("qc", 1): (1 / 3, 1.0, 0.0, 1.0, 1.0),
    ("qc", 3): (2 / 3, (1 + L3) / (1 + L3 + 1 / 2), 0.0, 2 / 3, 1.0),
    ("qc", 5): (2 / 3, (1 + L3) / (1 + L3 + 1 / 2), 0.0, 2 / 5, 1.0),
}
NAMES = ("recall", "ndcg", "comp", "precision", "mrr")


def as_dict(values: tuple[float, ...], k: int) -> dict[str, float]:
    return {f"{name}@{k}": v for name, v in zip(NAMES, values, strict=True)}


def test_hand_values_are_what_they_claim() -> None:
    assert EXPECTED["qa", 3][1] == pytest.approx(0.3869, abs=1e-4)
    assert EXPECTED["qa", 5][1] == pytest.approx(0.6509, abs=1e-4)
    assert EXPECTED["qc", 3][1] == pytest.approx(0.7654, abs=1e-4)


@pytest.mark.parametrize(("qid", "k"), list(EXPECTED))
def test_query_metrics_hand_computed(qid: str, k: int) -> None:
    relevant = set(QRELS[qid])
    top = ranked(RESULTS[qid], 10)
    assert query_metrics(relevant, top, k) == pytest.approx(as_dict(EXPECTED[qid, k], k))


@pytest.mark.parametrize("k", [1, 3, 5])
def test_evaluate_retrieval_averages_over_queries(k: int) -> None:
    out = evaluate_retrieval(QRELS, RESULTS, ks=(1, 3, 5))
    assert out["queries"] == 3.0
    for i, name in enumerate(NAMES):
        mean = sum(EXPECTED[qid, k][i] for qid in QRELS) / 3
        assert out[f"{name}@{k}"] == pytest.approx(mean), name


def test_recall_divides_by_relevant_set_size_not_k() -> None:
    # Three relevant tools, all three retrieved but the cut-off is 1: Recall@1 is 1/3, not 1.
    out = evaluate_retrieval({"q": {"a": 1, "b": 1, "c": 1}}, {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}, ks=(1,))
    assert out["recall@1"] == pytest.approx(1 / 3)
    assert out["ndcg@1"] == pytest.approx(1.0)
    assert out["comp@1"] == 0.0


def test_queries_without_relevant_tools_are_excluded() -> None:
    qrels = {"qb": QRELS["qb"], "q_zero": {"c": 0}, "q_empty": {}}
    results = {"qb": RESULTS["qb"], "q_zero": {"c": 1.0}, "q_empty": {"c": 1.0}}
    out = evaluate_retrieval(qrels, results, ks=(3,))
    assert out["queries"] == 1.0
    assert out == pytest.approx({**as_dict(EXPECTED["qb", 3], 3), "queries": 1.0})


def test_zero_score_tool_is_not_relevant() -> None:
    out = evaluate_retrieval({"q": {"a": 1, "b": 0}}, {"q": {"b": 2.0, "a": 1.0}}, ks=(1, 2))
    assert out["recall@1"] == 0.0
    assert out["recall@2"] == 1.0
    assert out["mrr@2"] == 0.5


def test_no_judged_queries_gives_only_the_count() -> None:
    assert evaluate_retrieval({}, {}, ks=(1,)) == {"queries": 0.0}


def test_query_missing_from_results_scores_zero() -> None:
    out = evaluate_retrieval({"qb": QRELS["qb"], "lost": {"a": 1}}, {"qb": RESULTS["qb"]}, ks=(1, 3))
    assert out["queries"] == 2.0
    for name in NAMES:
        assert out[f"{name}@1"] == pytest.approx(EXPECTED["qb", 1][NAMES.index(name)] / 2)
    assert out["precision@3"] == pytest.approx((1 / 3) / 2)


def test_ranked_keeps_equal_scores_in_the_methods_order() -> None:
    assert ranked({"b": 1.0, "c": 2.0, "a": 1.0, "d": 1.0}, 3) == ["c", "b", "a"]
    assert ranked({"b": 1.0, "a": 1.0}, 10) == ["b", "a"]


def test_ties_decide_hits_as_the_method_cut_them() -> None:
    results = {"q": {"b": 1.0, "a": 1.0}}
    assert evaluate_retrieval({"q": {"b": 1}}, results, ks=(1,))["recall@1"] == 1.0
    assert evaluate_retrieval({"q": {"a": 1}}, results, ks=(1,))["recall@1"] == 0.0


def test_metrics_at_k_of_a_deeper_list_score_the_methods_own_top_k() -> None:
    # BM25 with two identical tools, "z" first in the catalog: its top 1 is "z" (ties at the cut in
    # catalog order), and serving returns that. Scored at 1 from its top 10, an id order picked "a".
    from components.methods.bm25.method import BM25Method

    bm25 = BM25Method()
    tool = {"title": "", "text": "weather forecast"}
    bm25.index({"z": tool, "a": dict(tool)})
    own = bm25.retrieve({"q": "weather"}, 1)
    deep = bm25.retrieve({"q": "weather"}, 10)
    assert list(own["q"]) == ["z"]
    assert ranked(deep["q"], 1) == list(own["q"])
    qrels = {"q": {"z": 1}}
    assert evaluate_retrieval(qrels, deep, ks=(1,)) == evaluate_retrieval(qrels, own, ks=(1,))


# --- detection -----------------------------------------------------------------------------------------

LABELS = np.array([1, 1, 1, 0, 0, 0])
SCORES = np.array([0.9, 0.5, 0.2, 0.6, 0.1, 0.5])


def test_detection_metrics_hand_computed() -> None:
    # At 0.5 (inclusive): predictions 1,1,0,1,0,1 -> tp=2, fp=2, fn=1, tn=1.
    # AUROC: positive beats negative in 5 of 9 pairs plus one tie (0.5 vs 0.5) worth 1/2 -> 5.5 / 9.
    out = detection_metrics(LABELS, SCORES)
    assert out == pytest.approx(
        {"accuracy": 3 / 6, "precision": 2 / 4, "recall": 2 / 3, "f1": 4 / 7, "auroc": 5.5 / 9}
    )


def test_detection_metrics_threshold_moves_predictions() -> None:
    out = detection_metrics(LABELS, SCORES, threshold=0.8)
    # Only 0.9 is predicted positive: tp=1, fp=0, fn=2, tn=3.
    assert out["accuracy"] == pytest.approx(4 / 6)
    assert out["precision"] == 1.0
    assert out["recall"] == pytest.approx(1 / 3)
    assert out["f1"] == pytest.approx(0.5)
    assert out["auroc"] == pytest.approx(5.5 / 9)


def test_detection_metrics_nothing_predicted_positive() -> None:
    out = detection_metrics(LABELS, SCORES, threshold=0.95)
    assert (out["precision"], out["recall"], out["f1"]) == (0.0, 0.0, 0.0)
    assert out["accuracy"] == pytest.approx(0.5)


def test_auroc_hand_computed_with_ties() -> None:
    assert auroc(LABELS, SCORES) == pytest.approx(5.5 / 9)
    # Scores tie across classes at 0.4: pairs (0.8>0.4, 0.8>0.1, 0.4=0.4 -> 1/2, 0.4>0.1) = 3.5 / 4.
    assert auroc(np.array([1, 1, 0, 0]), np.array([0.8, 0.4, 0.4, 0.1])) == pytest.approx(3.5 / 4)


def test_auroc_extremes() -> None:
    assert auroc(np.array([1, 1, 0]), np.array([0.9, 0.8, 0.1])) == 1.0
    assert auroc(np.array([1, 1, 0]), np.array([0.1, 0.2, 0.9])) == 0.0
    assert auroc(np.array([1, 0, 1, 0]), np.array([0.3, 0.3, 0.3, 0.3])) == 0.5
    assert math.isnan(auroc(np.array([1, 1]), np.array([0.2, 0.4])))
    assert math.isnan(auroc(np.array([0, 0]), np.array([0.2, 0.4])))


@pytest.mark.parametrize("seed", range(5))
def test_auroc_matches_pairwise_count(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=40)
    labels[:2] = [0, 1]
    scores = rng.integers(0, 6, size=40) / 5  # few distinct values, so many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in product(pos, neg))
    assert auroc(labels, scores) == pytest.approx(wins / (len(pos) * len(neg)))


def test_paired_bootstrap_finds_a_consistent_gain_and_not_noise():
    from components.metrics import paired_bootstrap

    rng = np.random.default_rng(1)
    a = {str(i): float(v) for i, v in enumerate(rng.uniform(0, 1, 400))}
    better = {q: min(1.0, v + 0.05) for q, v in a.items()}
    got = paired_bootstrap(a, better, level=0.95, samples=1000)
    assert got["low"] > 0 and got["queries"] == 400 and got["p_not_better"] == 0.0
    noise = {q: float(v) for q, v in zip(a, rng.uniform(0, 1, 400), strict=True)}
    # Two unrelated systems of equal mean: the interval spans 0.
    same_mean = {q: noise[q] - np.mean(list(noise.values())) + np.mean(list(a.values())) for q in a}
    got = paired_bootstrap(a, same_mean, samples=1000)
    assert got["low"] < 0 < got["high"]
    with pytest.raises(ValueError, match="share no"):
        paired_bootstrap({"x": 1.0}, {"y": 1.0})


def test_per_query_values_average_to_the_reported_metric():
    from components.metrics import evaluate_retrieval, per_query

    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}, "q3": {"d": 0}}
    results = {"q1": {"a": 0.9, "x": 0.5}, "q2": {"x": 0.9, "c": 0.8, "b": 0.1}}
    values = per_query(qrels, results, "ndcg@3")
    assert set(values) == {"q1", "q2"}  # q3 judges no tool relevant
    assert np.mean(list(values.values())) == pytest.approx(evaluate_retrieval(qrels, results, (3,))["ndcg@3"])


def test_nan_scores_a_zero_cut_off_and_repeated_ids_are_not_scored_as_numbers() -> None:
    # A diverged model: NaN would sort anywhere (to the top for AUROC) and score 1.0.
    with pytest.raises(ValueError, match="'a' is NaN"):
        evaluate_retrieval({"q": {"a": 1, "b": 1}}, {"q": {"a": float("nan"), "b": 0.5, "c": 0.9}}, (1,))
    with pytest.raises(ValueError, match="2 of 3 scores are NaN"):
        auroc(np.array([1, 0, 1]), np.array([np.nan, 0.2, np.nan]))
    with pytest.raises(ValueError, match="cut-off k must be >= 1"):
        query_metrics({"a"}, ["a"], 0)
    # A tool named twice is one hit, at its first place: recall never passes 1.
    assert query_metrics({"a", "b"}, ["a", "a", "b"], 3) == query_metrics({"a", "b"}, ["a", "b"], 3)


def test_score_detection_takes_queries_needing_a_tool_against_the_no_tool_ones() -> None:
    # q2 is judged only irrelevant: it says nothing about needing a tool and is left out. The first
    # query's id is what MassTool's validation once keyed a negative with: it must not hide one.
    queries = {"neg-0": "book a flight", "q2": "hello there", "q3": "weather in rome"}
    qrels = {"neg-0": {"t1": 1.0}, "q2": {"t1": 0.0}, "q3": {"t2": 2.0}}
    seen: list[str] = []

    def detect(texts: dict[str, str]) -> dict[str, float]:
        seen.extend(texts.values())
        # Keys come back in another order than asked: scores must follow the keys, not the order.
        return {k: (0.9 if "a" in texts[k] else 0.2) for k in reversed(list(texts))}

    out = score_detection(detect, queries, qrels, ["good morning", "tell me a joke"], 0.5)
    assert seen == ["book a flight", "weather in rome", "good morning", "tell me a joke"]
    # A text holding an "a" scores 0.9: both positives and the second negative.
    assert out == detection_metrics(np.array([1, 1, 0, 0]), np.array([0.9, 0.9, 0.2, 0.9]), 0.5)
    assert out["accuracy"] == 0.75
