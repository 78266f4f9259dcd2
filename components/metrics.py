"""Retrieval and detection metrics, as the MassTool and COLT evaluation code computes them.

For a query with relevant set G and ranked top-K list, h = |topK ∩ G|:

* Recall@K = h / |G|  (divided by |G|, not min(K, |G|), so a 3-tool query caps Recall@1 at 1/3)
* NDCG@K: binary gains, DCG = Σ_{i≤K} hit_i / log2(i + 1), IDCG over min(|G|, K) ideal hits
* COMP@K = 1 if G ⊆ topK else 0  (completeness, from COLT)
* Precision@K = h / K, MRR@K = 1 / rank of the first hit within K

Scores are averaged over queries with |G| > 0; a query the retriever returned nothing for scores 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # type aliases only: metrics sit below the data layer
    from components.data.types import Qrels, Results

DEFAULT_KS = (1, 3, 5, 10)
# What the training stages compute on valid every epoch; a method's select_metric is one of them.
EPOCH_METRICS = ("recall@3", "ndcg@3", "recall@5")


def check_select_metric(method: str, metric: str, allowed: tuple[str, ...] = EPOCH_METRICS) -> None:
    """Fail on the driver for a ``select_metric`` no epoch computes (in a worker it would fail
    only after the first epoch); ``allowed``: what the method's stage computes."""
    if metric not in allowed:
        raise ValueError(f"{method}: select_metric must be one of {list(allowed)}, got {metric!r}")


def by_score(item: tuple[str, float]) -> float:
    """Sort key of a ``(tool id, score)`` pair for a stable sort: best score first, equal scores in
    the order the method gave them.

    Not by tool id: a method keeps tools tied at its cut in catalog order (the first ``k`` of its
    top ``K``, :func:`components.encoders.ranking.exact_top_k_np`), and an id order here picked
    other tied tools from a deeper list (metrics at 3 of a top 10) than the method's own top 3,
    which is what serving returns. A method's order is reproducible: every method builds its
    results from its catalog's order, never from a set."""
    return -item[1]


def ranked(scores: dict[str, float], k: int) -> list[str]:
    """Top-``k`` ids by score, equal scores in the method's order (:func:`by_score`).

    Raises:
        ValueError: a score is NaN (a diverged model): it would sort anywhere and score anything.
    """
    bad = next((d for d, s in scores.items() if s != s), None)
    if bad is not None:
        raise ValueError(f"score of {bad!r} is NaN: the model's outputs cannot be ranked")
    return [d for d, _ in sorted(scores.items(), key=by_score)[:k]]


def query_metrics(relevant: set[str], top: list[str], k: int) -> dict[str, float]:
    """Per-query metrics at cut-off ``k`` (>= 1) for a ranked list ``top`` (longer lists are cut;
    a tool named twice counts once, at its first place)."""
    if k < 1:
        raise ValueError(f"a metric's cut-off k must be >= 1, got {k}")
    top = list(dict.fromkeys(top))[:k]
    hits = [1.0 if d in relevant else 0.0 for d in top]
    h = sum(hits)
    dcg = sum(hit / math.log2(i + 2) for i, hit in enumerate(hits))
    idcg = sum(1.0 / math.log2(i + 2) for i in range(min(len(relevant), k)))
    first = next((i for i, hit in enumerate(hits) if hit), None)
    return {
        f"recall@{k}": h / len(relevant),
        f"ndcg@{k}": dcg / idcg,
        f"comp@{k}": 1.0 if relevant.issubset(top) else 0.0,
        f"precision@{k}": h / k,
        f"mrr@{k}": 0.0 if first is None else 1.0 / (first + 1),
    }


def relevant_tools(rel: dict[str, float]) -> set[str]:
    """The tools a query needs: those its qrels judge with relevance > 0."""
    return {d for d, s in rel.items() if s > 0}


def evaluate_retrieval(qrels: Qrels, results: Results, ks: tuple[int, ...] = DEFAULT_KS) -> dict[str, float]:
    """Mean metrics over queries with at least one relevant tool (score > 0).

    Args:
        qrels: Query id -> {tool id: relevance}; duplicate rows were merged by the loader.
        results: Query id -> {tool id: score}; queries absent here score 0.
        ks: Cut-offs.

    Returns:
        ``{"recall@3": ..., "ndcg@3": ..., "comp@3": ..., "precision@3": ..., "mrr@3": ..., ...}``
        plus ``"queries"``, the number of queries averaged over.
    """
    totals: dict[str, float] = {}
    n = 0
    depth = max(ks)
    for qid, rel in qrels.items():
        relevant = {d for d, s in rel.items() if s > 0}
        if not relevant:
            continue
        n += 1
        top = ranked(results.get(qid, {}), depth)
        for k in ks:
            for name, value in query_metrics(relevant, top, k).items():
                totals[name] = totals.get(name, 0.0) + value
    out = {name: value / n for name, value in totals.items()} if n else {}
    out["queries"] = float(n)
    return out


def auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve via the rank-sum (Mann–Whitney U) statistic, ties averaged."""
    labels = np.asarray(labels).astype(bool)
    scores = np.asarray(scores, dtype=np.float64)
    if np.isnan(scores).any():  # NaN sorts last, as the top score: a diverged detector scored 1.0
        raise ValueError(f"auroc: {int(np.isnan(scores).sum())} of {len(scores)} scores are NaN")
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def detection_metrics(labels: np.ndarray, scores: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """Tool-usage detection: label 1 = the query needs a tool; ``scores`` are probabilities.

    Returns accuracy, precision, recall and F1 of the positive class at ``threshold``, and AUROC.
    """
    labels = np.asarray(labels).astype(bool)
    pred = np.asarray(scores) >= threshold
    tp = int((pred & labels).sum())
    fp = int((pred & ~labels).sum())
    fn = int((~pred & labels).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "accuracy": float((pred == labels).mean()) if len(labels) else float("nan"),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "auroc": auroc(labels, scores),
    }


def score_detection(
    detect: Callable[[dict[str, str]], dict[str, float]],
    queries: dict[str, str],
    qrels: Qrels,
    negatives: list[str],
    threshold: float,
) -> dict[str, float]:
    """:func:`detection_metrics` of a detector (query id -> text to P(needs a tool)) on a split:
    its queries with a relevant tool as positives (one judged only irrelevant says nothing about
    needing a tool, and retrieval leaves it out too) against the split's no-tool ``negatives``."""
    needing = [text for q, text in queries.items() if relevant_tools(qrels.get(q, {}))]
    texts = needing + list(negatives)
    probs = detect({str(i): t for i, t in enumerate(texts)})  # fresh keys: no query id can collide
    labels = np.array([1] * len(needing) + [0] * len(negatives))
    return detection_metrics(labels, np.array([probs[str(i)] for i in range(len(texts))]), threshold)


def joint_score(ndcg_at_3: float, detect_accuracy: float) -> float:
    """One figure for both of MassTool's towers (arXiv 2507.00487): the mean of retrieval's N@3 and
    detection accuracy. A selection on N@3 alone is free to trade detection away (the MiniLM
    sweep's pick gave up 0.006 test accuracy for 0.002 R@3, ``toollens_masstool_minilm_tune_seeds``);
    MassTool's joint stage selects its epoch on this, and a sweep can select on it."""
    return (ndcg_at_3 + detect_accuracy) / 2


def per_query(qrels: Qrels, results: Results, metric: str) -> dict[str, float]:
    """``metric`` (e.g. ``ndcg@3``) of each query with a relevant tool: the paired samples a
    significance test compares two systems on."""
    _, _, k = metric.partition("@")
    if not k.isdigit():
        raise ValueError(f"per-query metric {metric!r}: expected <name>@<k>, e.g. ndcg@3")
    out = {}
    for qid, rel in qrels.items():
        relevant = relevant_tools(rel)
        if relevant:
            out[qid] = query_metrics(relevant, ranked(results.get(qid, {}), int(k)), int(k))[metric]
    return out


def paired_bootstrap(
    a: dict[str, float], b: dict[str, float], level: float = 0.95, samples: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Mean of ``b - a`` over the queries both score, with a percentile bootstrap interval.

    Queries are resampled with replacement, ``samples`` times, keeping each query's pair together
    (Efron & Tibshirani 1993; Sakai 2006 for IR evaluation), so the interval reflects which queries
    were drawn, not noise between systems. ``b`` is better at ``level`` when ``low > 0``.

    Returns:
        ``{"mean", "low", "high", "level", "queries", "p_not_better"}``; ``p_not_better`` is the
        share of resamples whose mean difference is <= 0.

    Raises:
        ValueError: the two share no query, or ``level`` is not in (0, 1).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap level must be in (0, 1), got {level}")
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("paired bootstrap: the two systems share no scored query")
    diff = np.array([b[q] - a[q] for q in common])
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(samples, len(diff)))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return {
        "mean": float(diff.mean()),
        "low": float(np.quantile(means, tail)),
        "high": float(np.quantile(means, 1.0 - tail)),
        "level": level,
        "queries": float(len(diff)),
        "p_not_better": float((means <= 0).mean()),
    }
