"""The full MassTool network: shared encoder, detection tower, QC-GCN, SUIM and AdaKT (arXiv 2507.00487).

The retrieval score of a query and a tool is the cosine of the query's joint embedding
(``AdaKT(h, SUIM(query))``) and the tool's QC-GCN embedding, over a temperature. The semantic
embeddings of the training queries (SUIM's search pool and the query nodes' layer-0 input) and
of the tools are cached buffers, refreshed each epoch when the encoder is being fine-tuned.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from components.encoders import TextEncoder
from components.encoders.embedding_cache import EmbeddingCache
from components.methods.masstool.graph import QueryGraphs
from components.methods.masstool.layers import QCGCN, SUIM, AdaKT, DetectionTower, ModelConfig

HEADS = "heads.safetensors"
META = "masstool.json"


class MassToolModel(nn.Module):
    """Both towers over one shared text encoder (see module docstring)."""

    def __init__(self, encoder: TextEncoder, graphs: QueryGraphs, cfg: ModelConfig) -> None:
        super().__init__()
        self.encoder, self.graphs, self.cfg = encoder, graphs, cfg
        text_dim = encoder.dim
        self.detector = DetectionTower(text_dim, cfg.detection_hidden)
        self.query_proj = nn.Linear(text_dim, cfg.dim)
        self.gcn = QCGCN(graphs, text_dim, cfg)
        self.suim = SUIM(cfg.dim, cfg) if cfg.suim and cfg.neighbours > 0 else None
        self.adakt = AdaKT(cfg.detection_hidden, cfg.dim, cfg.adakt) if cfg.adakt != "none" else None
        self.register_buffer("pool", torch.zeros(graphs.n_queries, text_dim))
        self.register_buffer("tool_text", torch.zeros(graphs.n_tools, text_dim))
        self.embedding_cache: EmbeddingCache | None = None

    def use_embedding_cache(self, root: str) -> None:
        """Freeze the encoder and read and write :meth:`embed`'s outputs under ``root``: a training
        run with ``finetune_encoder: false`` then embeds each text once across epochs, runs and
        Tune trials (:mod:`components.encoders.embedding_cache`)."""
        self.encoder.requires_grad_(False)
        self.embedding_cache = EmbeddingCache(root, self.encoder)

    def semantic(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Normalised encoder embeddings of tokenized queries."""
        return F.normalize(self.encoder(input_ids, attention_mask), dim=-1)

    @torch.no_grad()
    def embed(self, texts: list[str], max_length: int | None = None) -> torch.Tensor:
        """Normalised encoder embeddings of raw texts (eval mode, batched, CPU)."""
        if self.embedding_cache is not None:
            return F.normalize(self.embedding_cache.encode(texts, max_length), dim=-1)
        return F.normalize(self.encoder.encode(texts, max_length=max_length), dim=-1).cpu()

    @torch.no_grad()
    def refresh(self, query_texts: list[str], tool_texts: list[str], tool_max_length: int) -> None:
        """Re-embed the search pool (training queries) and the graph's tools with the current encoder."""
        device = self.pool.device
        self.pool.copy_(self.embed(query_texts).to(device))
        self.tool_text.copy_(self.embed(tool_texts, tool_max_length).to(device))

    def graph(
        self, cl_index: torch.Tensor | None = None, hide: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """QC-GCN over the cached semantic inputs: training-query and tool embeddings (+ CL loss).

        ``hide``: training queries whose edges this propagation leaves out (see :class:`QCGCN`).
        """
        return self.gcn(self.query_proj(self.pool), self.tool_text, cl_index, hide)

    def contrast_queries(self, batch: torch.Tensor, hide: torch.Tensor | None) -> torch.Tensor:
        """The training queries whose two views this step's cross-view loss aligns: the batch's own,
        or, when the batch's edges are hidden, as many drawn at random from the rest of the pool.

        A hidden query has no edge in either view, so both of its readouts are its own input over
        ``layers + 1``: contrasting it compared a vector with itself, gave the scene view no
        signal and only pushed the batch's query projections apart. The other training queries
        keep their edges (training pairs only, nothing of the batch leaks through them).
        """
        if hide is None or not (self.training and self.gcn.scene_view) or batch.numel() < 2:
            return batch
        rest = torch.ones(self.pool.shape[0], dtype=torch.bool, device=batch.device)
        rest[hide] = False
        rest = torch.nonzero(rest).squeeze(-1)
        return rest[torch.randperm(len(rest), device=batch.device)[: batch.numel()]]

    def search(
        self, semantic: torch.Tensor, exclude: torch.Tensor | None = None, hidden: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``K`` training queries by cosine; ``exclude[i]`` (a pool index, or -1) is skipped.

        ``hidden``: training queries whose edges this step hides (the batch's); they are nobody's
        neighbour here. Their graph readouts hold no tool, while at inference every neighbour
        carries its tools: kept, they made SUIM train on bare neighbours in proportion to the
        batch's share of the pool (a quarter of the slots at batch 64 of 238 queries).
        """
        sims = semantic @ self.pool.T
        k = min(self.cfg.neighbours, self.pool.shape[0])
        if exclude is not None:
            rows = torch.nonzero(exclude >= 0).squeeze(-1)
            sims[rows, exclude[rows]] = float("-inf")  # a training query is not its own neighbour
            # Never pick the excluded entry itself: its -inf would reach SUIM's w_sim gradient as
            # 0 * -inf = nan when the pool has no more than K queries.
            k = min(k, self.pool.shape[0] - 1)
        n_hidden = 0 if hidden is None else hidden.unique().numel()
        if 0 < n_hidden < self.pool.shape[0] - 1:
            sims[:, hidden] = float("-inf")
            k = min(k, self.pool.shape[0] - n_hidden)
        return sims.topk(k, dim=-1)

    def joint(
        self,
        semantic: torch.Tensor,
        query_graph: torch.Tensor,
        exclude: torch.Tensor | None = None,
        hidden: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Detection logits and the joint query embeddings ``e_joint`` (see :meth:`search`)."""
        logit, h = self.detector(semantic)
        e = self.query_proj(semantic)
        if self.suim is not None:
            sims, index = self.search(semantic.detach(), exclude, hidden)
            e, _ = self.suim(e, sims, query_graph[index])
        if self.adakt is not None:
            e = self.adakt(h, e)
        return logit, e

    def scores(self, e_joint: torch.Tensor, tools: torch.Tensor) -> torch.Tensor:
        """Cosine over temperature: the retrieval logits ``(B, T)``."""
        return F.normalize(e_joint, dim=-1) @ F.normalize(tools, dim=-1).T / self.cfg.temperature

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pool_index: torch.Tensor,
        semantic: torch.Tensor | None = None,
        twins: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor | None]:
        """One training step's outputs: detection logits, retrieval logits over the graph's tools, CL loss.

        Args:
            pool_index: ``(B,)`` each query's row in the search pool, -1 for queries outside it
                (no-tool queries); used to leave a query out of its own neighbours.
            semantic: Precomputed encoder embeddings of the batch (a frozen encoder's are fixed,
                so the task computes them once instead of running the encoder every step).
            twins: Pool rows of other training queries with the same request as a batch query
                (``same_request``); hidden with the batch. Kept, such a twin was a neighbour at
                cosine ~1 whose visible edges carried the batch query's own answer.
        """
        if semantic is None:
            semantic = self.semantic(input_ids, attention_mask)
        in_pool = pool_index[pool_index >= 0]
        twins = twins.to(in_pool) if twins is not None and twins.numel() else None
        hide = None
        if self.cfg.hide_batch_edges:
            hide = in_pool if twins is None else torch.cat([in_pool, twins])
        q_graph, t_graph, cl = self.graph(self.contrast_queries(in_pool, hide), hide=hide)
        # Twins are nobody's neighbour whatever hide_batch_edges says, as a query never is its own:
        # with the switch off, a twin was a neighbour at cosine 1 carrying the query's answer.
        unseen = hide if hide is not None else twins
        logit, e = self.joint(semantic, q_graph, exclude=pool_index, hidden=unseen)
        return {"logit": logit, "scores": self.scores(e, t_graph), "cl": cl}

    @torch.no_grad()
    def tool_index(self, tool_ids: list[str], tool_text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tool vectors for a (possibly new) catalogue, and the training queries' graph embeddings.

        Known tools get their graph embeddings, unseen tools their text alone. Both outputs come
        from one propagation over the catalogue's current texts, so SUIM's neighbour embeddings and
        the tool vectors they are scored against agree after a catalogue edit.

        Args:
            tool_ids: The catalogue to index.
            tool_text: ``(len(tool_ids), text_dim)`` their semantic embeddings.

        Returns:
            ``(tools (len(tool_ids), dim), query_graph (n_queries, dim))``.
        """
        tool_text = tool_text.to(self.tool_text.device)
        row = {t: i for i, t in enumerate(tool_ids)}
        graph_text = self.tool_text.clone()
        for j, t in enumerate(self.graphs.tool_ids):
            if t in row:  # current text of a known tool (a catalogue update may have edited it)
                graph_text[j] = tool_text[row[t]]
        q_graph, t_graph, _ = self.gcn(self.query_proj(self.pool), graph_text)
        known = {t: j for j, t in enumerate(self.graphs.tool_ids)}
        # A tool the graph never saw is an isolated node: its readout is its layer-0 text projection
        # averaged with L zero layers.
        scale = 1.0 / (self.cfg.layers + 1) if self.cfg.graph else 1.0
        unseen = self.gcn.tool_text(tool_text) * scale
        tools = torch.stack([t_graph[known[t]] if t in known else unseen[i] for i, t in enumerate(tool_ids)])
        return tools, q_graph

    def save(self, path: str) -> None:
        """Encoder in HF layout, every other weight and buffer in safetensors, graph in npz."""
        os.makedirs(path, exist_ok=True)
        self.encoder.save(os.path.join(path, "encoder"))
        self.graphs.save(path)
        heads = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file({k: v for k, v in heads.items() if not k.startswith("encoder.")}, os.path.join(path, HEADS))
        with open(os.path.join(path, META), "w") as f:
            json.dump(asdict(self.cfg), f, indent=2)

    @classmethod
    def load(cls, path: str) -> MassToolModel:
        """Inverse of :meth:`save`."""
        with open(os.path.join(path, META)) as f:
            cfg = ModelConfig(**json.load(f))
        model = cls(TextEncoder.load(os.path.join(path, "encoder")), QueryGraphs.load(path), cfg)
        missing, unexpected = model.load_state_dict(load_file(os.path.join(path, HEADS)), strict=False)
        missing = [k for k in missing if not k.startswith("encoder.")]
        if missing or unexpected:
            raise ValueError(
                f"{path}: weights do not match the model (missing {missing}, unexpected {unexpected})"
            )
        return model
