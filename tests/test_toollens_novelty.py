"""The novelty benchmark: nearest training query, bins by cosine, per-bin recall of each model."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from sklearn.preprocessing import normalize

from benchmarks.toollens_novelty import (
    NEIGHBOUR,
    SplitRecalls,
    TrainingPool,
    bin_label,
    markdown,
    nearest,
    recall_at_3,
    split_rows,
)
from components.data.types import Dataset, Queries, Results
from components.metrics import relevant_tools


def test_nearest_finds_the_most_similar_row_in_chunks():
    pool = csr_matrix(normalize(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])))
    queries = csr_matrix(normalize(np.array([[1.0, 0.1], [0.1, 1.0], [1.0, 1.0]])))
    best, cosine = nearest(queries, pool, chunk=2)  # two chunks: 2 rows, then 1
    assert best.tolist() == [0, 1, 2]
    assert cosine[2] == pytest.approx(1.0)
    assert cosine[0] == pytest.approx(1.0 / np.sqrt(1.01))


def test_recall_at_3_counts_relevant_tools_in_the_top_three_only():
    qrels = {"q1": {"t0": 1, "t9": 0}, "q2": {"t1": 1, "t2": 1}, "q3": {"t0": 1}}
    gold = {q: relevant_tools(qrels[q]) for q in ("q3", "q1", "q2")}
    results = {
        "q1": {"t0": 0.95, "t5": 0.9},  # t9 has relevance 0: q1 needs t0 alone, found (counting t9: 0.5)
        "q2": {"t1": 1.0},  # one of two
        "q3": {"t3": 0.9, "t4": 0.8, "t5": 0.7, "t0": 0.1},  # t0 is fourth: cut
    }
    assert recall_at_3(gold, results).tolist() == [0.0, 1.0, 0.5]


def _split(cosine: list[float], other: list[bool], **recalls: list[float]) -> SplitRecalls:
    n = len(cosine)
    arrays = {name: np.array(r) for name, r in recalls.items()}
    return SplitRecalls([f"q{i}" for i in range(n)], np.array(cosine), np.array(other), np.full(n, 2), arrays)


def test_split_rows_bin_by_cosine_and_report_each_models_recall():
    data = _split(
        [0.95, 0.9, 0.75, 0.6, 0.3],
        [False, True, False, False, False],
        **{NEIGHBOUR: [1.0, 0.5, 1.0, 1.0, 0.0], "model": [1.0, 1.0, 0.0, 1.0, 0.5]},
    )
    by = {(r["method"], r["config"]["neighbour_cosine"]): r["metrics"] for r in split_rows("test", data)}
    top, mid, six, low = bin_label(0), bin_label(2), bin_label(3), bin_label(4)
    assert (top, mid, six, low) == ("[0.9, 1]", "[0.7, 0.8)", "[0.6, 0.7)", "[0.0, 0.6)")
    # 0.9 and 0.6 sit on edges: each belongs to the bin it opens.
    assert by[(NEIGHBOUR, top)] == {
        "queries": 2,
        "share": 0.4,
        "tools_per_query": 2.0,
        "other_tools_rate": 0.5,
        "recall@3": 0.75,
        "miss_share": 0.3333,  # lost 0.5 of the 1.5 it lost on the split
    }
    assert by[(NEIGHBOUR, six)]["queries"] == 1
    assert by[("model", top)] == {"recall@3": 1.0, "miss_share": 0.0}
    assert by[(NEIGHBOUR, bin_label(1))] == {"queries": 0, "share": 0.0}  # an empty bin has no rates
    assert by[("model", mid)] == {"recall@3": 0.0, "miss_share": 0.6667}
    assert by[("model", low)] == {"recall@3": 0.5, "miss_share": 0.3333}
    assert by[(NEIGHBOUR, "all")]["queries"] == 5
    assert by[("model", "all")] == {"recall@3": 0.7, "miss_share": 1.0}
    assert sum(by[(NEIGHBOUR, bin_label(i))]["queries"] for i in range(5)) == 5  # bins partition


def test_split_rows_need_the_neighbour_recalls_for_the_bin_sizes():
    with pytest.raises(ValueError, match=NEIGHBOUR):
        split_rows("test", _split([0.5], [False], model=[1.0]))


def test_markdown_puts_the_models_side_by_side():
    data = _split([0.95, 0.3], [True, False], **{NEIGHBOUR: [0.0, 1.0], "masstool": [1.0, 0.5]})
    table = markdown(split_rows("valid", data))
    head = "| split | neighbour cosine | queries | share | tools/query | other tools |"
    assert head + " R@3 nearest_train_query (misses) | R@3 masstool (misses) |" in table
    assert "| valid | [0.9, 1] | 1 | 0.5000 | 2.0000 | 1.0000 | 0.0000 (100%) | 1.0000 (0%) |" in table
    assert "| valid | [0.8, 0.9) | 0 | 0.0000 |  |  |  |  |" in table
    assert "| valid | all | 2 | 1.0000 | 2.0000 | 0.5000 | 0.5000 (100%) | 0.7500 (100%) |" in table


def _scenes() -> Dataset:
    """Two scenes; the valid query is a near-copy of a training query of the other scene."""
    texts = {
        "a0": "cook a rice recipe with nutrition facts",
        "a1": "cook a bean recipe with nutrition facts",
        "b0": "book a flight to paris and a hotel",
        "b1": "book a flight to rome and a hotel",
        "va": "book a flight to paris and a hotel room",  # needs the cooking tools all the same
        "vb": "book a flight to oslo and a hotel",
        "vz": "a query that needs no tool",
    }
    cook, fly = {"t0": 1, "t1": 1}, {"t2": 1, "t3": 1}
    return Dataset(
        name="tiny",
        corpus={t: {"_id": t, "title": "", "text": t, "metadata": {}} for t in ("t0", "t1", "t2", "t3")},
        queries=texts,
        qrels={
            "train": {"a0": cook, "a1": cook, "b0": fly, "b1": fly},
            "valid": {"va": cook, "vb": fly, "vz": {"t0": 0}},
        },
    )


def test_training_pool_finds_each_queries_neighbour_and_scores_the_models():
    def always_flights(texts: Queries) -> Results:
        return {q: {"t2": 1.0, "t3": 0.9} for q in texts}

    data = TrainingPool(_scenes()).recalls("valid", {"flights": always_flights})
    assert data.qids == ["va", "vb"]  # vz needs no tool: left out, as evaluate_retrieval does
    assert data.cosine[0] > 0.9  # va's neighbour is b0, almost the same text
    assert data.other.tolist() == [True, False]  # ... which needs other tools
    assert data.tools.tolist() == [2, 2]
    assert data.recalls[NEIGHBOUR].tolist() == [0.0, 1.0]
    assert data.recalls["flights"].tolist() == [0.0, 1.0]


def test_a_model_that_misses_nothing_has_no_miss_share():
    rows = split_rows("test", _split([0.5, 0.95], [False, False], **{NEIGHBOUR: [1.0, 1.0]}))
    assert all("miss_share" not in r["metrics"] for r in rows)
