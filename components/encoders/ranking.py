"""Exact top-k over a NumPy score matrix, ties in catalog order: the rule of
:func:`components.encoders.vector_index.exact_top_k` without torch.

BM25 ranks with this one: a serving replica of a BM25 artifact must not import torch (about a second
of CPU per replica start on 2 cores, and the memory of a second runtime), see
``components/encoders/__init__.py``.
"""

from __future__ import annotations

import numpy as np


def exact_top_k_np(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` best columns of each row of ``scores`` (2-D), best first, equal scores
    in position order, also at the cut: a column tied with the k-th is kept only if it comes first.

    Raises:
        ValueError: ``scores`` is not 2-D or ``k`` is negative.
    """
    if scores.ndim != 2:
        raise ValueError(f"scores must be a 2-D matrix, got shape {scores.shape}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    rows, n = scores.shape
    k = min(k, n)
    if k == 0:
        return np.zeros((rows, 0), dtype=np.int64)
    # argpartition keeps an arbitrary k of the columns tied with the k-th: rows with more than k
    # at or above it (an exact tie at the cut, rare outside duplicated tools) are sorted in full.
    picked = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    kth = np.take_along_axis(scores, picked, axis=1).min(axis=1, keepdims=True)
    crowded = np.flatnonzero((scores >= kth).sum(axis=1) > k)
    if len(crowded):
        picked[crowded] = np.argsort(-scores[crowded], axis=1, kind="stable")[:, :k]
    # Within the k: best first, then lower position (lexsort's last key is the primary one).
    values = np.take_along_axis(scores, picked, axis=1)
    order = np.lexsort((picked, -values), axis=1)
    return np.take_along_axis(picked, order, axis=1).astype(np.int64, copy=False)
