"""The novelty benchmark: nearest training query, bins by cosine, per-bin recall of each model."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from sklearn.preprocessing import normalize

from benchmarks.toollens_novelty import NEIGHBOUR, bin_label, markdown, nearest, recall_at_3, split_rows
from components.data.types import Dataset


def test_nearest_finds_the_most_similar_row_in_chunks():
    pool = csr_matrix(normalize(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])))
    queries = csr_matrix(normalize(np.array([[1.0, 0.1], [0.1, 1.0], [1.0, 1.0]])))
    best, cosine = nearest(queries, pool, chunk=2)  # two chunks: 2 rows, then 1
    assert best.tolist() == [0, 1, 2]
    assert cosine[2] == pytest.approx(1.0)
    assert cosine[0] == pytest.approx(1.0 / np.sqrt(1.01))


def test_recall_at_3_reads_only_relevant_tools_and_the_top_three():
    ds = Dataset(
        name="tiny",
        corpus={},
        queries={"q1": "a", "q2": "b"},
        qrels={"test": {"q1": {"t0": 1, "t9": 0}, "q2": {"t1": 1, "t2": 1}}},
    )
    results = {"q1": {"t0": 0.1, "t3": 0.9, "t4": 0.8, "t5": 0.7}, "q2": {"t1": 1.0}}
    # q1: t0 is fourth, so missed (t9 has relevance 0 and does not count); q2: one of two found.
    assert recall_at_3(ds, "test", results).tolist() == [0.0, 0.5]


def test_split_rows_bin_by_cosine_and_report_each_models_recall():
    cosine = np.array([0.95, 0.92, 0.75, 0.3])
    other = np.array([False, True, False, False])
    recalls = {NEIGHBOUR: np.array([1.0, 0.5, 1.0, 0.0]), "model": np.array([1.0, 1.0, 0.0, 1.0])}
    rows = split_rows("test", cosine, other, recalls)
    by = {(r["method"], r["config"]["neighbour_cosine"]): r["metrics"] for r in rows}
    top, mid, low = bin_label(0), bin_label(2), bin_label(4)
    assert (top, mid, low) == ("[0.9, 1]", "[0.7, 0.8)", "[0.0, 0.6)")
    assert by[(NEIGHBOUR, top)] == {"queries": 2, "share": 0.5, "other_tools_rate": 0.5, "recall@3": 0.75}
    assert by[("model", top)] == {"recall@3": 1.0}
    assert by[(NEIGHBOUR, bin_label(1))] == {"queries": 0, "share": 0.0}  # an empty bin has no rates
    assert by[("model", mid)] == {"recall@3": 0.0}
    assert by[("model", low)] == {"recall@3": 1.0}
    assert by[(NEIGHBOUR, "all")]["queries"] == 4
    assert by[("model", "all")] == {"recall@3": 0.75}
    assert sum(by[(NEIGHBOUR, bin_label(i))]["queries"] for i in range(5)) == 4  # bins partition


def test_markdown_puts_the_models_side_by_side():
    cosine, other = np.array([0.95, 0.3]), np.array([True, False])
    recalls = {NEIGHBOUR: np.array([0.0, 1.0]), "masstool": np.array([1.0, 0.5])}
    table = markdown(split_rows("valid", cosine, other, recalls))
    head = "| split | neighbour cosine | queries | share | other tools |"
    assert head + " R@3 nearest_train_query | R@3 masstool |" in table
    assert "| valid | [0.9, 1] | 1 | 0.5000 | 1.0000 | 0.0000 | 1.0000 |" in table
    assert "| valid | [0.8, 0.9) | 0 | 0.0000 |  |  |  |" in table
    assert "| valid | all | 2 | 1.0000 | 0.5000 | 0.5000 | 0.7500 |" in table
