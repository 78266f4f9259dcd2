"""Sparse graphs over tools, queries and scenes, and the tool–tool co-occurrence matrix.

All builders take integer index arrays so that the single-process build and the Ray Data build
(:mod:`workflows.preprocess`) share one kernel, :func:`partial_cooccurrence`: Ray runs it on
hash-partitioned blocks (every basket whole inside one block) and sums the partial counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from io import BytesIO

import numpy as np
import scipy.sparse as sp

from components.data import io


@dataclass(frozen=True)
class IdMap:
    """A fixed order of string ids, so that matrix rows and columns can be named."""

    ids: tuple[str, ...]

    @classmethod
    def of(cls, ids: Iterable[str]) -> IdMap:
        """Sorted numerically when every id is an ASCII integer string (ToolLens), else lexically.

        ``(int, str)`` keys keep ``"7"`` and ``"007"`` in a fixed order; ``isdigit`` alone would
        accept ``"²"``, which ``int`` rejects.
        """
        unique = set(ids)
        if all(i.isascii() and i.isdecimal() for i in unique):
            return cls(tuple(sorted(unique, key=lambda i: (int(i), i))))
        return cls(tuple(sorted(unique)))

    def index(self) -> dict[str, int]:
        """Id -> position."""
        return {k: i for i, k in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)


def incidence(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    """A binary sparse matrix with ones at (rows, cols); repeated pairs count once."""
    m = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=shape)
    m.data[:] = 1.0
    return m


def partial_cooccurrence(basket: np.ndarray, tool: np.ndarray, n_tools: int) -> sp.coo_matrix:
    """Tool–tool co-occurrence counts for the baskets present in these pairs.

    ``C[a, b]`` is the number of baskets (queries or trajectories) that use both a and b; the
    diagonal holds how many baskets use each tool. Exact only when every basket's pairs are all
    present, which the Ray build guarantees by hash-partitioning on the basket id.
    """
    if len(basket) == 0:
        return sp.coo_matrix((n_tools, n_tools), dtype=np.int64)
    local, inverse = np.unique(basket, return_inverse=True)
    b = incidence(inverse, tool, (len(local), n_tools))
    return (b.T @ b).astype(np.int64).tocoo()


def cooccurrence(basket: np.ndarray, tool: np.ndarray, n_tools: int) -> sp.csr_matrix:
    """The single-process reference build of the co-occurrence matrix (CSR, int64)."""
    return partial_cooccurrence(basket, tool, n_tools).tocsr()


def qrels_pairs(
    qrels: dict[str, dict[str, int]], queries: IdMap, tools: IdMap
) -> tuple[np.ndarray, np.ndarray]:
    """(query index, tool index) arrays of the positive pairs in ``qrels``, sorted by query."""
    qi, ti = queries.index(), tools.index()
    pairs = [(qi[q], ti[t]) for q, rel in qrels.items() for t, s in rel.items() if s > 0]
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    # Sorted by query: downstream builds take a shuffle-free path on basket-sorted pairs.
    arr = arr[np.lexsort((arr[:, 1], arr[:, 0]))]
    return arr[:, 0], arr[:, 1]


def save_sparse(
    path: str, matrix: sp.spmatrix, row_ids: IdMap, col_ids: IdMap, storage_options: dict | None = None
) -> None:
    """Save ``matrix`` as ``<path>.npz`` (scipy, no pickle) and its id maps as ``<path>.ids.json``."""
    buffer = BytesIO()
    sp.save_npz(buffer, sp.csr_matrix(matrix))
    io.write_bytes(path + ".npz", buffer.getvalue(), storage_options)
    ids = {"rows": list(row_ids.ids), "cols": list(col_ids.ids), "shape": list(matrix.shape)}
    io.write_bytes(path + ".ids.json", json.dumps(ids).encode(), storage_options)


def load_sparse(path: str, storage_options: dict | None = None) -> tuple[sp.csr_matrix, IdMap, IdMap]:
    """Inverse of :func:`save_sparse`."""
    with io.filesystem(path, storage_options).open(path + ".npz", "rb") as f:
        matrix = sp.load_npz(f).tocsr()
    ids = json.loads(io.read_bytes(path + ".ids.json", storage_options))
    return matrix, IdMap(tuple(ids["rows"])), IdMap(tuple(ids["cols"]))
