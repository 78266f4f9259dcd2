"""MassTool's two towers (arXiv 2507.00487): tool-usage detection and query-centric graph retrieval.

Modules, each switchable for ablations:

- :class:`DetectionTower` — text encoder → projection → P(query needs a tool), and the hidden
  state ``h`` that AdaKT transfers to the retrieval tower.
- :class:`QCGCN` — LightGCN over the query–tool view and the query–scene view (tools read off the
  scene view through the scene–tool map), ``L`` layers, layer-mean readout, edge dropout, and a
  cross-view InfoNCE loss with temperature. Each layer is ``Â x`` with Â = D^-1/2 A D^-1/2 (PyTorch
  Geometric's ``gcn_norm``, as its ``LGConv`` computes it) as one sparse matrix product.
- :class:`SUIM` — search-based user intent modelling: the query's top-``K`` most similar training
  queries (cosine over the semantic embeddings), dynamic filtering of those below ``ε``, and an
  additive intent-attention network that fuses the kept neighbours' graph embeddings.
- :class:`AdaKT` — adaptive knowledge transfer ``e_joint = σ(W h) ⊗ e_search`` and the attention,
  concatenation and addition variants the paper compares.

A query never seen in training is not a graph node: it is embedded by the encoder and enriched by
its SUIM neighbours, which are. That is what lets the serving endpoint score arbitrary queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from components.methods.masstool.graph import QueryGraphs
from components.methods.masstool.propagation import SortedEdges, SymmetricSpMM, normalized_adjacency

ADAKT_MODES = ("gate", "attention", "concat", "add", "none")


@dataclass
class ModelConfig:
    """Architecture switches and sizes (the subset of the method's params the model needs)."""

    dim: int = 128
    detection_hidden: int = 128
    layers: int = 2
    edge_dropout: float = 0.1
    graph: bool = True  # QC-GCN on; off = tools are their text (plus an ID vector) only
    contrastive: bool = True  # build the second view and its InfoNCE loss
    cl_temperature: float = 0.2
    hide_batch_edges: bool = True  # a training query's own edges are left out of its step's graph
    # Share of trained tools made cold in each training step (ID vector and edges dropped), so the
    # retrieval tower also learns to rank tools by their text alone, as it must for tools added
    # after training. Not in the paper: DropoutNet's input dropout (Volkovs et al., NeurIPS 2017).
    tool_dropout: float = 0.0
    suim: bool = True
    neighbours: int = 10  # K
    epsilon: float = 0.5  # ε: neighbours with cosine below it are dropped
    dynamic_filter: bool = True
    adakt: str = "gate"
    temperature: float = 0.05  # retrieval softmax temperature

    def __post_init__(self) -> None:
        if self.adakt not in ADAKT_MODES:
            raise ValueError(f"adakt must be one of {ADAKT_MODES}, got {self.adakt!r}")
        if self.layers < 0 or self.neighbours < 0:
            raise ValueError("layers and neighbours must be >= 0")
        if not 0.0 <= self.tool_dropout < 1.0:
            raise ValueError(f"tool_dropout must be in [0, 1), got {self.tool_dropout}")


class DetectionTower(nn.Module):
    """Projection of the query's semantic embedding to a hidden state and a needs-a-tool logit."""

    def __init__(self, text_dim: int, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(text_dim, hidden), nn.GELU(), nn.Dropout(0.1))
        self.out = nn.Linear(hidden, 1)

    def forward(self, semantic: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logit (B,), h (B, hidden))``."""
        h = self.proj(semantic)
        return self.out(h).squeeze(-1), h


def info_nce(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE between two views of the same nodes (row i of ``a`` ↔ row i of ``b``)."""
    a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    logits = a @ b.T / temperature
    target = torch.arange(a.shape[0], device=a.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


class QCGCN(nn.Module):
    """Query-centric LightGCN over the query–tool and query–scene views (see module docstring)."""

    def __init__(self, graphs: QueryGraphs, text_dim: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_queries, self.n_tools = graphs.n_queries, graphs.n_tools
        self.tool_text = nn.Linear(text_dim, cfg.dim, bias=False)
        self.tool_id = nn.Embedding(graphs.n_tools, cfg.dim)
        nn.init.normal_(self.tool_id.weight, std=0.02)
        # Tools with no training edge keep a zero ID vector: their embedding is their text alone,
        # exactly what a tool added after training gets.
        trained = torch.zeros(graphs.n_tools, 1)
        trained[torch.as_tensor(graphs.query_tool[1], dtype=torch.long)] = 1.0
        self.register_buffer("trained_tool", trained, persistent=True)
        self.register_buffer("tool_edges", graphs.tool_view_edges(), persistent=True)
        # Each edge set's CSR layout, built on first use (the buffers may have moved device since).
        self._sorted: dict[tuple, SortedEdges] = {}
        # The scene view exists only to contrast with the propagated query–tool view.
        self.scene_view = cfg.contrastive and cfg.graph and graphs.has_scenes
        if self.scene_view:
            self.scene_emb = nn.Embedding(graphs.n_scenes, cfg.dim)
            nn.init.normal_(self.scene_emb.weight, std=0.02)
            self.register_buffer("scene_edges", graphs.scene_view_edges(), persistent=True)
            self.register_buffer("scene_tool", graphs.scene_tool_matrix(), persistent=True)
            # The contrastive pairs: queries with a scene, tools with a scene and a training edge
            # (otherwise one of the two views holds nothing but the node's own layer-0 input).
            has_scene = torch.zeros(graphs.n_queries, dtype=torch.bool)
            has_scene[torch.as_tensor(graphs.query_scene[0], dtype=torch.long)] = True
            self.register_buffer("query_has_scene", has_scene, persistent=False)
            both = (self.scene_tool.sum(1) > 0) & (self.trained_tool.squeeze(-1) > 0)
            self.register_buffer("cl_tools", both, persistent=False)

    def tool_features(self, tool_text: torch.Tensor, cold: torch.Tensor | None = None) -> torch.Tensor:
        """Layer-0 tool nodes: projected text + ID vector (zero for tools never seen in training,
        and for the ``cold`` ones of this step)."""
        known = self.trained_tool if cold is None else self.trained_tool * (~cold).unsqueeze(-1)
        return self.tool_text(tool_text) + self.tool_id.weight * known

    def cold_tools(self) -> torch.Tensor | None:
        """This training step's tools to treat as unseen (``tool_dropout`` of the trained ones), or None."""
        if not (self.training and self.cfg.tool_dropout > 0):
            return None
        draw = torch.rand(self.n_tools, device=self.trained_tool.device) < self.cfg.tool_dropout
        return draw & (self.trained_tool.squeeze(-1) > 0)

    def propagate(
        self, x: torch.Tensor, edges: torch.Tensor, hide: torch.Tensor | None = None
    ) -> torch.Tensor:
        """LightGCN: ``L`` parameter-free propagations, mean of layers 0..L (the layer-sum readout).

        Args:
            hide: Nodes whose edges are left out of this propagation (see :meth:`forward`).
        """
        adj = self.propagation_matrix(edges, x.shape[0], hide)
        out, h = x, x
        for _ in range(self.cfg.layers):
            h = SymmetricSpMM.apply(adj, h)
            out = out + h
        return out / (self.cfg.layers + 1)

    def propagation_matrix(self, edges: torch.Tensor, n: int, hide: torch.Tensor | None) -> torch.Tensor:
        """Â = D^-1/2 A D^-1/2 over this step's edges (:func:`normalized_adjacency`)."""
        # One entry per buffer, checked against its contents: ``load_state_dict`` (and DDP's buffer
        # broadcast, every step) copy into the same tensor in place.
        key = (edges.data_ptr(), tuple(edges.shape), str(edges.device))
        graph = self._sorted.get(key)
        if graph is None or not torch.equal(graph.source, edges):
            graph = self._sorted[key] = SortedEdges(edges, n)
        dropout = self.cfg.edge_dropout if self.training else 0.0
        return normalized_adjacency(graph, n, hide, dropout)

    def forward(
        self,
        query_x: torch.Tensor,
        tool_text: torch.Tensor,
        cl_index: torch.Tensor | None = None,
        hide: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Query and tool embeddings of the query–tool view, and the cross-view loss (or None).

        Args:
            query_x: ``(Nq, dim)`` layer-0 embeddings of the training queries.
            tool_text: ``(T, text_dim)`` semantic embeddings of the graph's tools.
            cl_index: Training queries of the current batch; when given (and the scene view is
                on, in training), the InfoNCE loss aligns their two views, and every tool's.
            hide: Training queries of the current batch, whose edges this step leaves out. A
                query met at inference is not a graph node, so in training a query must not reach
                its own relevant tools through its edges (the tools' readout would contain the
                query's own embedding: a shortcut that does not exist for new queries).
        """
        cold = self.cold_tools()
        tools0 = self.tool_features(tool_text, cold)
        if not self.cfg.graph:
            return query_x, tools0, None
        hide_nodes = hide
        if cold is not None:
            # A cold tool is an isolated node this step, as a tool added after training is.
            cold_nodes = self.n_queries + torch.nonzero(cold).squeeze(-1)
            hide_nodes = cold_nodes if hide is None else torch.cat([hide, cold_nodes])
        nodes = self.propagate(torch.cat([query_x, tools0]), self.tool_edges, hide_nodes)
        q1, t1 = nodes[: self.n_queries], nodes[self.n_queries :]
        if not (self.training and self.scene_view):
            return q1, t1, None
        if cl_index is None or cl_index.numel() < 2:
            # No pair to contrast in this batch; a zero that still touches the scene embeddings,
            # so multi-worker DDP finds every parameter used in every step.
            return q1, t1, self.scene_emb.weight.sum() * 0.0
        nodes2 = self.propagate(torch.cat([query_x, self.scene_emb.weight]), self.scene_edges, hide)
        q2, s2 = nodes2[: self.n_queries], nodes2[self.n_queries :]
        t2 = self.scene_tool @ s2  # scene–tool aggregation: a tool is the mean of its scenes
        cl_index = cl_index.unique()  # a query twice in one batch would be its own negative
        cl_index = cl_index[self.query_has_scene[cl_index]]
        loss = t1.new_zeros(())
        if cl_index.numel() >= 2:
            loss = loss + info_nce(q1[cl_index], q2[cl_index], self.cfg.cl_temperature)
        cl_tools = self.cl_tools if cold is None else self.cl_tools & ~cold  # a cold tool has no view 1
        if int(cl_tools.sum()) >= 2:
            loss = loss + info_nce(t1[cl_tools], t2[cl_tools], self.cfg.cl_temperature)
        loss = loss + self.scene_emb.weight.sum() * 0.0  # every parameter used each step (DDP)
        return q1, t1, loss


class SUIM(nn.Module):
    """Search-based user intent modelling: attention over the query's kept nearest training queries."""

    def __init__(self, dim: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.w_query = nn.Linear(dim, dim)
        self.w_key = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, 1, bias=False)
        self.w_sim = nn.Parameter(torch.ones(1))

    def forward(
        self, query: torch.Tensor, sims: torch.Tensor, neighbours: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``e_search = query + Σ_i a_i g_i`` over kept neighbours, and the kept mask.

        Args:
            query: ``(B, dim)`` projected query embeddings.
            sims: ``(B, K)`` cosine similarity to each searched neighbour.
            neighbours: ``(B, K, dim)`` the neighbours' graph embeddings ``g_i``.
        """
        keep = (
            sims >= self.cfg.epsilon if self.cfg.dynamic_filter else torch.ones_like(sims, dtype=torch.bool)
        )
        scores = self.v(torch.tanh(self.w_query(query)[:, None] + self.w_key(neighbours))).squeeze(-1)
        scores = (scores + self.w_sim * sims).masked_fill(~keep, float("-inf"))
        # A query whose neighbours are all filtered out keeps its own embedding (weights all zero).
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        return query + (weights.unsqueeze(-1) * neighbours).sum(1), keep


class AdaKT(nn.Module):
    """Adaptive knowledge transfer from the detection tower's hidden state into the search embedding."""

    def __init__(self, hidden: int, dim: int, mode: str) -> None:
        super().__init__()
        self.mode = mode
        if mode == "concat":
            self.proj = nn.Linear(hidden + dim, dim)
        else:
            self.proj = nn.Linear(hidden, dim)
        if mode == "attention":
            self.att = nn.Linear(dim, dim)
            self.att_v = nn.Linear(dim, 1, bias=False)

    def forward(self, h: torch.Tensor, e_search: torch.Tensor) -> torch.Tensor:
        if self.mode == "gate":  # the paper's AdaKT: e_joint = σ(W h) ⊗ e_search
            return torch.sigmoid(self.proj(h)) * e_search
        if self.mode == "add":
            return e_search + self.proj(h)
        if self.mode == "concat":
            return self.proj(torch.cat([h, e_search], dim=-1))
        # attention: weigh the search embedding against the transferred detection knowledge
        cands = torch.stack([e_search, self.proj(h)], dim=1)  # (B, 2, dim)
        weights = torch.softmax(self.att_v(torch.tanh(self.att(cands))), dim=1)
        return (weights * cands).sum(1)
