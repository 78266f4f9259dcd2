"""NumPy exact top-k (BM25's ranking): the same answers as the torch rule dense and MassTool use."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from components.encoders.ranking import exact_top_k_np
from components.encoders.vector_index import exact_top_k


def tied_scores(rows: int, n: int, levels: int, seed: int) -> np.ndarray:
    """Scores drawn from a few values, so most rows tie at every cut (as BM25 over repeated texts)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, levels, size=(rows, n)).astype(np.float32) / 4


@pytest.mark.parametrize("levels", [2, 5, 1000])
def test_numpy_and_torch_rank_alike_ties_included(levels):
    scores = tied_scores(30, 40, levels, seed=levels)
    for k in (0, 1, 3, 7, 39, 40, 55):
        got = exact_top_k_np(scores, k)
        want = exact_top_k(torch.from_numpy(scores), min(k, 40))[1].numpy()
        assert got.shape == (30, min(k, 40)) and np.array_equal(got, want), k


def test_ties_keep_catalog_order_and_a_top_k_is_the_head_of_a_deeper_one():
    scores = np.array([[1.0, 2.0, 2.0, 2.0, 0.5, 2.0]], dtype=np.float32)
    assert exact_top_k_np(scores, 2).tolist() == [[1, 2]]
    assert exact_top_k_np(scores, 6).tolist() == [[1, 2, 3, 5, 0, 4]]
    deep = exact_top_k_np(tied_scores(50, 200, 3, seed=0), 200)
    for k in (1, 4, 17, 120):
        assert np.array_equal(exact_top_k_np(tied_scores(50, 200, 3, seed=0), k), deep[:, :k])


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="2-D"):
        exact_top_k_np(np.zeros(3), 1)
    with pytest.raises(ValueError, match="k must be >= 0"):
        exact_top_k_np(np.zeros((1, 3)), -1)
