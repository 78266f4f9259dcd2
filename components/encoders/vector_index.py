"""Top-k tools by inner product: exact for small catalogs, an HNSW graph (FAISS) for large ones.

Exact search multiplies every query by every tool vector; its cost grows with the catalog (1M
tools of 384 dimensions is 1.5 GB read per query batch). HNSW (Malkov & Yashunin, "Efficient and
robust approximate nearest neighbor search using Hierarchical Navigable Small World graphs",
TPAMI 2018) visits a few thousand vectors per query instead, at a recall below 1 that
``ef_search`` trades against time. ``kind: auto`` keeps exact search below ``exact_below`` tools,
where it is both exact and fast enough, and builds the graph above it.

The index is built once per set of tool vectors (at index or load time, off the request path) and
lives beside them, so a serving replica swaps it together with the model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

KINDS = ("auto", "exact", "faiss", "hnsw")


@dataclass(frozen=True)
class IndexSettings:
    """How tool vectors are searched (the ``index`` section of a retriever's params).

    Attributes:
        kind: ``exact`` (torch matmul), ``faiss`` (FAISS's exact inner-product index), ``hnsw``,
            or ``auto`` (exact below ``exact_below`` tools, HNSW above).
        exact_below: The catalog size from which ``auto`` builds HNSW.
        m: HNSW links per node (memory and recall grow with it).
        ef_construction: Candidate list size while building (build time and graph quality).
        ef_search: Candidate list size per query (recall against time).
    """

    kind: str = "auto"
    exact_below: int = 50_000
    m: int = 32
    ef_construction: int = 80
    ef_search: int = 256

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"index kind must be one of {KINDS}, got {self.kind!r}")
        for name in ("exact_below", "m", "ef_construction", "ef_search"):
            if getattr(self, name) < 1:
                raise ValueError(f"index {name} must be >= 1, got {getattr(self, name)}")

    def resolved(self, n: int) -> str:
        """The kind used for ``n`` tools."""
        if self.kind != "auto":
            return self.kind
        return "hnsw" if n >= self.exact_below else "exact"


class VectorIndex:
    """Inner-product top-k over a fixed ``(N, D)`` matrix of tool vectors."""

    def __init__(self, vectors: torch.Tensor, settings: IndexSettings | None = None) -> None:
        self.settings = settings or IndexSettings()
        self.size, self.dim = vectors.shape
        self.kind = self.settings.resolved(self.size)
        started = time.perf_counter()
        self._expand: torch.Tensor | None = None
        if self.kind == "exact":
            # Identical tool vectors (duplicate descriptions) are scored once and the score copied:
            # a matrix product rounds identical columns apart (~1e-8, by position and batch size),
            # so their tie, broken by catalog order, went to either, and changed with the batch.
            distinct, inverse = vectors.unique(dim=0, return_inverse=True)
            self._matrix, self._expand = (distinct, inverse) if len(distinct) < self.size else (vectors, None)
            self._faiss = None
        else:
            self._matrix = None
            self._faiss = self._build_faiss(vectors.detach().cpu().numpy().astype(np.float32))
        self.build_seconds = time.perf_counter() - started

    def _build_faiss(self, matrix: np.ndarray):  # -> faiss.Index
        try:
            import faiss
        except ImportError as e:
            hint = "pip install 'toolscout[faiss]'"
            raise RuntimeError(f"index kind {self.kind!r} needs faiss-cpu: {hint}") from e
        s = self.settings
        if self.kind == "faiss":
            index = faiss.IndexFlatIP(self.dim)
        else:
            index = faiss.IndexHNSWFlat(self.dim, s.m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = s.ef_construction
            index.hnsw.efSearch = s.ef_search
        index.add(np.ascontiguousarray(matrix))
        return index

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scores, positions)``, each ``(Q, k)``, best first; a position of -1 means fewer than
        ``k`` hits (HNSW only, when ``ef_search`` < ``k``)."""
        k = min(k, self.size)
        if self._faiss is None:
            product = queries @ self._matrix.T
            return exact_top_k(product if self._expand is None else product[:, self._expand], k)
        if k == 0:  # FAISS asserts k > 0; an empty catalogue has no hits, as exact search says
            return torch.empty(len(queries), 0), torch.empty(len(queries), 0, dtype=torch.long)
        found = np.ascontiguousarray(queries.detach().cpu().numpy(), np.float32)
        scores, positions = self._faiss.search(found, k)
        return ties_by_position(torch.from_numpy(scores), torch.from_numpy(positions))

    def memory_bytes(self) -> int:
        """Bytes the index holds: the matrix for exact search, the vectors plus the graph for HNSW."""
        if self._faiss is None:
            return self._matrix.element_size() * self._matrix.nelement()
        import faiss

        return int(faiss.serialize_index(self._faiss).nbytes)


def ties_by_position(scores: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hits best first with equal scores in position order (-1, no hit, last). Tools with the same
    vector (duplicate descriptions) tie exactly; without a rule, ``torch.topk`` and FAISS order
    them differently, and an answer would change with the index kind or the thread count."""
    missing = positions < 0
    key = torch.where(missing, torch.iinfo(torch.long).max, positions)
    by_position = key.argsort(dim=1, stable=True)
    scores, positions = scores.gather(1, by_position), positions.gather(1, by_position)
    ranked = torch.where(positions < 0, -torch.inf, scores).argsort(dim=1, descending=True, stable=True)
    return scores.gather(1, ranked), positions.gather(1, ranked)


def exact_top_k(product: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` best columns of each row of ``product``, ties broken by the lower position, also
    at the cut: a tool tied with the k-th is kept only if it comes first in the catalog."""
    scores, positions = product.topk(k, dim=1)
    if k == 0:
        return scores, positions
    # topk may keep any of the tools tied with the k-th; rows where one was left out are sorted in
    # full (rare: it takes an exact tie at the cut), the rest only reordered within their k.
    crowded = ((product >= scores[:, -1:]).sum(dim=1) > k).nonzero().squeeze(1)
    if len(crowded):
        full, order = product[crowded].sort(dim=1, descending=True, stable=True)
        scores[crowded], positions[crowded] = full[:, :k], order[:, :k]
    return ties_by_position(scores, positions)
