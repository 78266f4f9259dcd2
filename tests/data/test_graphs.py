"""Tool–tool co-occurrence against a brute-force count, and sparse matrix persistence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from components.data.graphs import (
    IdMap,
    cooccurrence,
    incidence,
    load_sparse,
    partial_cooccurrence,
    qrels_pairs,
    save_sparse,
)

N_TOOLS = 9


def random_pairs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(basket, tool) pairs with sparse basket ids, repeated pairs and a shuffled order."""
    rng = np.random.default_rng(seed)
    basket_ids = rng.choice(10_000, size=25, replace=False)
    pairs = []
    for b in basket_ids:
        tools = rng.integers(0, N_TOOLS, size=rng.integers(1, 6))
        pairs.extend((int(b), int(t)) for t in tools)
        if rng.random() < 0.5:
            pairs.append((int(b), int(tools[0])))
    order = rng.permutation(len(pairs))
    arr = np.asarray(pairs, dtype=np.int64)[order]
    return arr[:, 0], arr[:, 1]


def brute_force(basket: np.ndarray, tool: np.ndarray, n_tools: int) -> np.ndarray:
    baskets: dict[int, set[int]] = {}
    for b, t in zip(basket.tolist(), tool.tolist(), strict=True):
        baskets.setdefault(b, set()).add(t)
    expected = np.zeros((n_tools, n_tools), dtype=np.int64)
    for tools in baskets.values():
        for a in tools:
            for c in tools:
                expected[a, c] += 1
    return expected


@pytest.mark.parametrize("seed", range(6))
def test_cooccurrence_matches_brute_force(seed: int) -> None:
    basket, tool = random_pairs(seed)
    matrix = cooccurrence(basket, tool, N_TOOLS)
    assert matrix.dtype == np.int64
    assert matrix.shape == (N_TOOLS, N_TOOLS)
    np.testing.assert_array_equal(matrix.toarray(), brute_force(basket, tool, N_TOOLS))


@pytest.mark.parametrize("seed", range(6))
def test_partial_cooccurrence_matches_brute_force(seed: int) -> None:
    basket, tool = random_pairs(seed)
    np.testing.assert_array_equal(
        partial_cooccurrence(basket, tool, N_TOOLS).toarray(), brute_force(basket, tool, N_TOOLS)
    )


@pytest.mark.parametrize("seed", range(6))
def test_cooccurrence_symmetric_with_usage_on_diagonal(seed: int) -> None:
    basket, tool = random_pairs(seed)
    dense = cooccurrence(basket, tool, N_TOOLS).toarray()
    np.testing.assert_array_equal(dense, dense.T)
    usage = [len({b for b, t in zip(basket, tool, strict=True) if t == i}) for i in range(N_TOOLS)]
    np.testing.assert_array_equal(np.diag(dense), usage)


def test_duplicate_pairs_counted_once() -> None:
    basket = np.array([5, 5, 5, 5, 8])
    tool = np.array([1, 1, 2, 1, 1])
    dense = cooccurrence(basket, tool, 3).toarray()
    np.testing.assert_array_equal(dense, [[0, 0, 0], [0, 2, 1], [0, 1, 1]])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n_parts", [1, 3, 7])
def test_partials_over_a_basket_partition_sum_to_full(seed: int, n_parts: int) -> None:
    basket, tool = random_pairs(seed)
    part = basket % n_parts
    total = sum(
        partial_cooccurrence(basket[part == p], tool[part == p], N_TOOLS).toarray() for p in range(n_parts)
    )
    np.testing.assert_array_equal(total, cooccurrence(basket, tool, N_TOOLS).toarray())


def test_partial_cooccurrence_of_no_pairs_is_zero() -> None:
    empty = np.array([], dtype=np.int64)
    matrix = partial_cooccurrence(empty, empty, 4)
    assert matrix.shape == (4, 4)
    assert matrix.nnz == 0
    assert matrix.dtype == np.int64


def test_incidence_is_binary() -> None:
    m = incidence(np.array([0, 0, 1]), np.array([2, 2, 0]), (2, 3))
    np.testing.assert_array_equal(m.toarray(), [[0, 0, 1], [1, 0, 0]])


def test_id_map_sorts_numeric_ids_numerically() -> None:
    assert IdMap.of(["10", "2", "1", "2"]).ids == ("1", "2", "10")
    assert IdMap.of(["b", "10", "a"]).ids == ("10", "a", "b")
    assert IdMap.of(["x", "y"]).index() == {"x": 0, "y": 1}


def test_qrels_pairs_skips_zero_scores() -> None:
    queries, tools = IdMap.of(["q1", "q2"]), IdMap.of(["t1", "t2", "t3"])
    q, t = qrels_pairs({"q1": {"t1": 1, "t3": 2}, "q2": {"t2": 0}}, queries, tools)
    assert sorted(zip(q.tolist(), t.tolist(), strict=True)) == [(0, 0), (0, 2)]
    q, t = qrels_pairs({}, queries, tools)
    assert len(q) == len(t) == 0


def test_save_load_sparse_round_trip(tmp_path: Path) -> None:
    basket, tool = random_pairs(0)
    matrix = cooccurrence(basket, tool, N_TOOLS)
    ids = IdMap.of(str(i) for i in range(N_TOOLS))
    path = str(tmp_path / "graphs" / "nested" / "cooc")
    save_sparse(path, matrix, ids, ids)
    loaded, rows, cols = load_sparse(path)
    assert (tmp_path / "graphs" / "nested" / "cooc.npz").exists()
    assert (tmp_path / "graphs" / "nested" / "cooc.ids.json").exists()
    assert loaded.dtype == np.int64
    np.testing.assert_array_equal(loaded.toarray(), matrix.toarray())
    assert rows == ids
    assert cols == ids


def test_save_load_sparse_rectangular(tmp_path: Path) -> None:
    rows, cols = IdMap.of(["q1", "q2"]), IdMap.of(["a", "b", "c"])
    matrix = incidence(np.array([0, 1, 1]), np.array([2, 0, 1]), (2, 3))
    save_sparse(str(tmp_path / "qt"), matrix, rows, cols)
    loaded, loaded_rows, loaded_cols = load_sparse(str(tmp_path / "qt"))
    assert loaded.shape == (2, 3)
    np.testing.assert_array_equal(loaded.toarray(), matrix.toarray())
    assert (loaded_rows, loaded_cols) == (rows, cols)


def test_counts_past_float32_precision_are_exact():
    # Multiplied in float32, 2**24 + 3 baskets using one tool counted 2**24 (16,777,216): the
    # single-process build disagreed with the Ray build, which sums its blocks in int64.
    n = 2**24 + 3
    c = cooccurrence(np.arange(n), np.zeros(n, dtype=np.int64), 2)
    assert c.dtype == np.int64 and int(c[0, 0]) == n and int(c[1, 1]) == 0
