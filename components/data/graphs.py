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
from components.data.types import Dataset

GRAPH_SPLIT = "train"  # graphs see training pairs only: valid/test pairs would leak into the model
GRAPH_NAMES = ("cooccurrence", "query_tool", "scene_tool", "query_scene")


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
    # Counted in int64: a float32 product rounds a count above 2**24 (16.8M baskets using a tool).
    b = incidence(inverse, tool, (len(local), n_tools)).astype(np.int64)
    return (b.T @ b).tocoo()


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


@dataclass(frozen=True)
class SparseGraph:
    """A sparse matrix with named rows and columns (as saved under ``graphs/`` of a prepared dir)."""

    matrix: sp.csr_matrix
    rows: IdMap
    cols: IdMap

    def pairs(self) -> list[tuple[str, str]]:
        """The (row id, column id) of every stored non-zero."""
        coo = self.matrix.tocoo()
        return [(self.rows.ids[r], self.cols.ids[c]) for r, c in zip(coo.row, coo.col, strict=True)]


def load_graphs(path: str, storage_options: dict | None = None) -> dict[str, SparseGraph]:
    """Every graph in a prepared directory's ``graphs/`` (absent ones are left out)."""
    out = {}
    for name in GRAPH_NAMES:
        target = io.join(path, "graphs", name)
        if io.exists(target + ".npz", storage_options):
            out[name] = SparseGraph(*load_sparse(target, storage_options))
    return out


def training_pairs(dataset: Dataset) -> list[tuple[str, str]]:
    """The (query id, tool id) pairs judged relevant in the training split: the query-tool graph's edges."""
    return [(q, t) for q, rel in dataset.qrels.get(GRAPH_SPLIT, {}).items() for t, s in rel.items() if s > 0]


def graph_inputs(dataset: Dataset) -> dict[str, tuple[list[tuple[str, str]], IdMap, IdMap]]:
    """What each training graph is built from: its (row id, column id) pairs and id maps.

    The one definition both builds use: Ray Data's in ``toolscout preprocess`` and the
    in-process one of :func:`training_graphs`.
    """
    tools = IdMap.of(dataset.corpus)
    queries = IdMap.of(dataset.qrels.get(GRAPH_SPLIT, {}))
    out = {"query_tool": (training_pairs(dataset), queries, tools)}
    qs = list(dataset.query_scene.get(GRAPH_SPLIT, {}).items())
    if qs:
        scenes = IdMap.of(s for _, s in qs)
        out["scene_tool"] = (
            [(s, t) for s in scenes.ids for t in dataset.scene_tool.get(s, ())],
            scenes,
            tools,
        )
        out["query_scene"] = (qs, queries, scenes)
    return out


def training_graphs(dataset: Dataset) -> dict[str, SparseGraph]:
    """The dataset's training graphs: those preprocessing built with Ray Data when the dataset was
    loaded from a prepared directory, else built here from the same inputs (:func:`graph_inputs`)
    with the same kernels (:func:`cooccurrence`, :func:`incidence`).

    Raises:
        ValueError: the prepared graphs are not those of the dataset's training split: its
            query-tool pairs differ from the training qrels (qrels rewritten after preprocessing),
            so every graph built from them (co-occurrence included) would be stale.
    """
    if dataset.graphs:
        qt = dataset.graphs.get("query_tool")
        if qt is None:
            # Nothing to check the others against (the co-occurrence could be stale), and the
            # graph methods would fail on a bare KeyError.
            raise ValueError(
                f"{dataset.name}: the prepared directory has graphs but no graphs/query_tool.npz "
                f"(has {sorted(dataset.graphs)}); re-run toolscout preprocess"
            )
        wanted = set(training_pairs(dataset))
        if set(qt.pairs()) != wanted:
            raise ValueError(
                f"{dataset.name}: the prepared query_tool graph's {qt.matrix.nnz} edges are not the "
                f"{len(wanted)} query-tool pairs of the dataset's {GRAPH_SPLIT} qrels; re-run preprocessing"
            )
        return dict(dataset.graphs)
    inputs = graph_inputs(dataset)
    _, queries, tools = inputs["query_tool"]
    q_idx, t_idx = qrels_pairs(dataset.qrels.get(GRAPH_SPLIT, {}), queries, tools)
    out = {"cooccurrence": SparseGraph(cooccurrence(q_idx, t_idx, len(tools)), tools, tools)}
    for name, (pairs, rows, cols) in inputs.items():
        ri, ci = rows.index(), cols.index()
        r = np.asarray([ri[a] for a, _ in pairs], dtype=np.int64)
        c = np.asarray([ci[b] for _, b in pairs], dtype=np.int64)
        out[name] = SparseGraph(incidence(r, c, (len(rows), len(cols))), rows, cols)
    return out
