"""The training graphs of MassTool's query-centric graph convolution (arXiv 2507.00487, Sec. QC-GCN).

Two views over the training split only (valid/test edges would leak labels into the model):

- **query–tool**: a bipartite graph on ``queries ∪ tools``, one edge per relevant training pair;
- **query–scene**: a bipartite graph on ``queries ∪ scenes`` (a scene groups the tools one
  kind of request needs), with the scene–tool map used to read tool embeddings off this view.

Edges are stored as PyTorch Geometric ``edge_index`` tensors in both directions, so that a
propagation carries queries → tools and tools → queries. The edges are read off the graphs that
``toolscout preprocess`` built with Ray Data (``graphs/*.npz`` of the prepared directory), or off
the same build run in-process for a raw dataset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from components.data.graphs import GRAPH_SPLIT, SparseGraph, incidence, training_graphs
from components.data.types import Dataset

GRAPH_FILE = "graph.npz"


def bipartite_edges(rows: np.ndarray, cols: np.ndarray, n_rows: int) -> torch.Tensor:
    """``(2, 2E)`` undirected edge index on ``rows ∪ cols`` (columns offset by ``n_rows``)."""
    src = torch.as_tensor(rows, dtype=torch.long)
    dst = torch.as_tensor(cols, dtype=torch.long) + n_rows
    return torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])


@dataclass
class QueryGraphs:
    """Query–tool and query–scene graphs of the training queries.

    Attributes:
        query_ids: Training query ids (node order of the query side; also SUIM's search pool).
        tool_ids: Every tool in the corpus (node order of the tool side); tools without a training
            edge are isolated nodes whose embedding comes from their text alone.
        scene_ids: Scenes of the training queries (empty when the dataset has no scene files).
        query_tool: ``(2, E)`` pairs (query index, tool index).
        query_scene: ``(2, E)`` pairs (query index, scene index).
        scene_tool: ``(2, E)`` pairs (scene index, tool index).
    """

    query_ids: list[str]
    tool_ids: list[str]
    scene_ids: list[str]
    query_tool: np.ndarray
    query_scene: np.ndarray
    scene_tool: np.ndarray

    @property
    def n_queries(self) -> int:
        return len(self.query_ids)

    @property
    def n_tools(self) -> int:
        return len(self.tool_ids)

    @property
    def n_scenes(self) -> int:
        return len(self.scene_ids)

    @property
    def has_scenes(self) -> bool:
        return self.n_scenes > 0 and self.query_scene.shape[1] > 0

    def tool_view_edges(self) -> torch.Tensor:
        """Edge index of the query–tool view on ``queries ∪ tools``."""
        return bipartite_edges(self.query_tool[0], self.query_tool[1], self.n_queries)

    def scene_view_edges(self) -> torch.Tensor:
        """Edge index of the query–scene view on ``queries ∪ scenes``."""
        return bipartite_edges(self.query_scene[0], self.query_scene[1], self.n_queries)

    def scene_tool_matrix(self) -> torch.Tensor:
        """``(T, S)`` row-normalised map that averages a tool's scenes (zero rows for tools in none)."""
        m = incidence(self.scene_tool[1], self.scene_tool[0], (self.n_tools, max(self.n_scenes, 1)))
        dense = torch.as_tensor(m.toarray(), dtype=torch.float32)
        return dense / dense.sum(1, keepdim=True).clamp(min=1.0)

    def save(self, path: str) -> None:
        """One ``graph.npz`` (ids as string arrays, edges as int64) in an artifact dir."""
        os.makedirs(path, exist_ok=True)
        np.savez(
            os.path.join(path, GRAPH_FILE),
            query_ids=np.asarray(self.query_ids, dtype=str),
            tool_ids=np.asarray(self.tool_ids, dtype=str),
            scene_ids=np.asarray(self.scene_ids, dtype=str),
            query_tool=self.query_tool,
            query_scene=self.query_scene,
            scene_tool=self.scene_tool,
        )

    @classmethod
    def load(cls, path: str) -> QueryGraphs:
        with np.load(os.path.join(path, GRAPH_FILE)) as z:
            return cls(
                query_ids=z["query_ids"].tolist(),
                tool_ids=z["tool_ids"].tolist(),
                scene_ids=z["scene_ids"].tolist(),
                query_tool=z["query_tool"],
                query_scene=z["query_scene"],
                scene_tool=z["scene_tool"],
            )


def _edges(graph: SparseGraph, rows: dict[str, int], cols: dict[str, int]) -> np.ndarray:
    """``(2, E)`` (row index, column index) of ``graph``'s pairs in the given node orders, sorted
    by row then column (the order the edges had when built from qrels), rows outside ``rows`` or
    columns outside ``cols`` left out."""
    pairs = [(rows[a], cols[b]) for a, b in graph.pairs() if a in rows and b in cols]
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    arr = arr[np.lexsort((arr[:, 1], arr[:, 0]))]
    return arr.T.copy()


def build_graphs(data: Dataset) -> QueryGraphs:
    """The training queries' graphs, from what preprocessing built with Ray Data (or the same build
    in-process for a raw dataset: :func:`components.data.graphs.training_graphs`).

    Node orders are the training qrels' query order and the corpus's tool order, so the model's
    rows line up with the dataset however the graphs were built.

    Raises:
        ValueError: the prepared graphs are not those of this dataset's training split (e.g. a
            dataset whose qrels were changed after loading): re-run preprocessing, or clear
            ``data.graphs`` to build them here.
    """
    graphs = training_graphs(data)
    query_ids = list(data.qrels[GRAPH_SPLIT])
    tool_ids = list(data.corpus)
    qt = graphs["query_tool"]
    if set(qt.rows.ids) != set(query_ids) or set(qt.cols.ids) != set(tool_ids):
        raise ValueError(
            f"{data.name}: the prepared query_tool graph has {len(qt.rows)} queries x {len(qt.cols)} tools, "
            f"the dataset {len(query_ids)} training queries x {len(tool_ids)} tools; re-run preprocessing"
        )
    qidx = {q: i for i, q in enumerate(query_ids)}
    tidx = {t: i for i, t in enumerate(tool_ids)}
    query_tool = _edges(qt, qidx, tidx)  # its pairs are the train qrels' (training_graphs checks)
    scene_ids: list[str] = []
    query_scene = scene_tool = np.zeros((2, 0), dtype=np.int64)
    if "query_scene" in graphs:
        scene_ids = sorted(graphs["query_scene"].cols.ids)
        sidx = {s: i for i, s in enumerate(scene_ids)}
        query_scene = _edges(graphs["query_scene"], qidx, sidx)
        scene_tool = _edges(graphs["scene_tool"], sidx, tidx)
    return QueryGraphs(
        query_ids=query_ids,
        tool_ids=tool_ids,
        scene_ids=scene_ids,
        query_tool=query_tool,
        query_scene=query_scene,
        scene_tool=scene_tool,
    )
