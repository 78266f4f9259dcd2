"""MassTool's joint training stage (arXiv 2507.00487), built inside each Ray Train worker.

Examples are the training queries (they need their relevant tools) and the no-tool training
queries (detection negatives). The loss is ``L_retrieval + λ · L_detection + β · L_contrastive``:

- retrieval: a softmax over every tool per relevant tool, the query's other relevant tools
  masked out of the negatives (multi-tool queries are not penalised for ranking them high);
- detection: binary cross-entropy of the needs-a-tool logit;
- contrastive: QC-GCN's cross-view InfoNCE.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
import torch
import torch.nn.functional as F

from components.data import io
from components.data.splits import same_request
from components.data.tooltext import tool_texts
from components.data.types import Dataset
from components.encoders.bi_encoder import BiEncoder
from components.methods.masstool.graph import build_graphs
from components.methods.masstool.method import MassToolMethod
from components.methods.masstool.model import MassToolModel
from components.methods.masstool.params import MassToolParams
from components.metrics import evaluate_retrieval, joint_score, score_detection
from components.training.parallel import unwrap
from components.training.spec import StageConfig
from components.training.task import StageTask


def retrieval_loss(scores: torch.Tensor, relevant: torch.Tensor) -> torch.Tensor:
    """Mean over relevant (query, tool) pairs of ``-log softmax`` against the query's negatives.

    Args:
        scores: ``(B, T)`` logits.
        relevant: ``(B, T)`` bool; rows without a relevant tool contribute nothing.
    """
    if not bool(relevant.any()):
        # Zero that keeps every parameter in the graph (DDP) without a signal; the where() drops
        # the -inf of masked non-candidates first, since -inf * 0 would make the logged loss nan.
        return torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores)).sum() * 0.0
    negatives = torch.logsumexp(scores.masked_fill(relevant, float("-inf")), dim=1, keepdim=True)
    # -log(e^s / (e^s + Σ_neg e^n)) = softplus(logsumexp(neg) - s); where() keeps masked -inf
    # scores of non-candidates from turning into inf * 0 = nan.
    per_pair = torch.where(relevant, F.softplus(negatives - scores), torch.zeros_like(scores))
    return per_pair.sum() / relevant.sum()


log = logging.getLogger(__name__)


def world_size() -> int:
    """The workers of the Ray Train run this task is built in (1 outside one, or in local mode)."""
    try:
        import ray.train

        return max(1, int(ray.train.get_context().get_world_size()))
    except Exception:  # not inside a Ray Train run (a test, the driver)
        return 1


class MassToolTask(StageTask):
    """The joint stage, starting from the semantic stage's bi-encoder (``config.inputs.init_dir``)."""

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self.params: MassToolParams = config.params
        data = config.inputs.dataset
        self.data: Dataset = ray.get(data) if isinstance(data, ray.ObjectRef) else data
        self.graphs = build_graphs(self.data)
        self.tool_index = {t: i for i, t in enumerate(self.graphs.tool_ids)}
        # Each worker hides its own batch: the global batch split across the workers, as the loader
        # splits it (counted whole, the warning overstated the share by the worker count).
        pool, per_worker = len(self.graphs.query_ids), int(config.batch_size) // world_size()
        if self.params.hide_batch_edges and pool and per_worker > pool / 2:
            # Each step hides its batch's edges (and takes no SUIM neighbour from it): a batch
            # holding most of the pool trains on a graph with few edges left, or none, while
            # inference propagates over all of them.
            log.warning(
                "masstool: a batch of up to %d queries hides up to %.0f%% of the %d-query training "
                "graph each step (inference sees all of it); lower the batch size below half the pool",
                per_worker,
                100 * min(1.0, per_worker / pool),
                pool,
            )
        # Training queries that repeat another's request (equal up to case, punctuation and
        # spacing): a batch hides its queries' twins with them (see MassToolModel.forward).
        rows: dict[str, list[int]] = {}
        for i, q in enumerate(self.graphs.query_ids):
            rows.setdefault(same_request(self.data.queries[q]), []).append(i)
        self._twins = {
            i: [j for j in group if j != i] for group in rows.values() if len(group) > 1 for i in group
        }
        self._refreshed = False
        self._semantic: torch.Tensor | None = None  # per-example embeddings when the encoder is frozen

    def build_model(self) -> MassToolModel:
        assert self.config.inputs.init_dir is not None, "the joint stage starts from the semantic stage"
        semantic = io.fetch(self.config.inputs.init_dir, self.config.storage_options)
        encoder = BiEncoder.load(semantic).encoder
        model = MassToolModel(encoder, self.graphs, self.params.model_config())
        if not self.params.finetune_encoder:
            model.encoder.requires_grad_(False)
            if self.params.embedding_cache:
                model.use_embedding_cache(self.params.embedding_cache)
        self._tokenizer, self._max_length = encoder.tokenizer, encoder.max_length
        return model

    def param_groups(self, model: MassToolModel) -> list[dict[str, Any]]:
        """The encoder fine-tunes at ``encoder_lr``; the freshly initialised modules at ``lr``."""
        encoder = [p for p in model.encoder.parameters() if p.requires_grad]
        ids = {id(p) for p in encoder}
        rest = [p for p in model.parameters() if id(p) not in ids]
        groups = [{"params": rest}]
        if encoder:
            groups.append({"params": encoder, "lr": self.params.encoder_lr})
        return groups

    def refresh(self, model: MassToolModel) -> None:
        """Re-embed the search pool (training queries) and the tools with the current encoder."""
        model.refresh(
            [self.data.queries[q] for q in self.graphs.query_ids],
            tool_texts(self.data.corpus, self.graphs.tool_ids, self.params.tool_fields),
            self.params.tool_max_length,
        )

    def start_epoch(self, model: MassToolModel, epoch: int) -> None:
        """Embed the search pool and tools once; :meth:`validate` keeps them current after that."""
        if not self._refreshed:
            self.refresh(model)
            self._refreshed = True
            if not self.params.finetune_encoder:
                # A frozen encoder's embeddings never change: compute each example's once.
                negatives = self.data.neg_split.get("train", [])
                neg = model.embed(negatives) if negatives else model.pool.new_zeros(0, model.pool.shape[1])
                self._semantic = torch.cat([model.pool.cpu(), neg.cpu()])

    def train_data(self) -> list[tuple[str, int, tuple[int, ...], int]]:
        """``(text, pool row or -1, relevant tool indices, example row)`` per training example."""
        qrels = self.data.qrels["train"]
        items = [
            (self.data.queries[q], i, tuple(self.tool_index[t] for t, s in qrels[q].items() if s > 0), i)
            for i, q in enumerate(self.graphs.query_ids)
        ]
        # No-tool queries: detection negatives, outside the search pool, no retrieval target.
        n = len(items)
        return items + [(text, -1, (), n + j) for j, text in enumerate(self.data.neg_split.get("train", []))]

    def collate(self, items: list[tuple[str, int, tuple[int, ...], int]]) -> dict[str, torch.Tensor]:
        tokens = self._tokenizer(
            [t for t, _, _, _ in items],
            padding=True,
            truncation=True,
            max_length=self._max_length,
            return_tensors="pt",
        )
        relevant = torch.zeros(len(items), self.graphs.n_tools, dtype=torch.bool)
        for i, (_, _, rel, _) in enumerate(items):
            relevant[i, list(rel)] = True
        pool_index = torch.tensor([p for _, p, _, _ in items])
        batch = {
            "input_ids": tokens["input_ids"],
            "attention_mask": tokens["attention_mask"],
            "pool_index": pool_index,
            "relevant": relevant,
            # Where the example came from, not its judgements: a pool query needs a tool.
            "needs_tool": (pool_index >= 0).float(),
        }
        # A pool query judged only irrelevant says nothing about needing a tool: evaluation leaves
        # it out of detection, and so does the detection loss (its label would be a guess).
        unjudged = torch.tensor([p >= 0 and not rel for _, p, rel, _ in items])
        if bool(unjudged.any()):
            batch["detect_weight"] = (~unjudged).float()
        if self._twins:
            rows = {int(p) for p in pool_index if p >= 0}
            twins = sorted({t for p in rows for t in self._twins.get(p, ())} - rows)
            batch["twins"] = torch.tensor(twins, dtype=torch.long)
        if self._semantic is not None:
            batch["semantic"] = self._semantic[torch.tensor([r for _, _, _, r in items])]
        return batch

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        p = self.params
        out = model(
            batch["input_ids"],
            batch["attention_mask"],
            batch["pool_index"],
            batch.get("semantic"),
            batch.get("twins"),
        )
        # Tools with no training edge are not candidates in training: in the cold-start split they
        # stand for tools added later, and pushing them down as negatives would bias against them.
        trained = unwrap(model).gcn.trained_tool.squeeze(-1) > 0
        scores = out["scores"].masked_fill(~trained, float("-inf"))
        loss = retrieval_loss(scores, batch["relevant"])
        weight = batch.get("detect_weight")
        if weight is None:
            detection = F.binary_cross_entropy_with_logits(out["logit"], batch["needs_tool"])
        else:  # the mean over the examples that say whether a tool is needed
            each = F.binary_cross_entropy_with_logits(out["logit"], batch["needs_tool"], reduction="none")
            detection = (each * weight).sum() / weight.sum().clamp_min(1.0)
        loss = loss + p.detection_weight * detection
        if out["cl"] is not None:
            loss = loss + p.contrastive_weight * out["cl"]
        return loss

    def validate(self, model: torch.nn.Module) -> dict[str, float]:
        if self.params.finetune_encoder:
            # The encoder moved this epoch: re-embed now, so that validation and the checkpoint
            # saved after it pair the encoder with a pool and tool texts from the same weights.
            self.refresh(model)
        method = MassToolMethod.from_model(model, self.params)
        method.index(self.data.corpus)
        queries = self.data.split_queries("valid")
        metrics = evaluate_retrieval(self.data.qrels["valid"], method.retrieve(queries, 10))
        out = {m: metrics[m] for m in ("recall@3", "ndcg@3", "recall@5", "ndcg@5")}
        negatives = self.data.neg_split.get("valid", [])
        if negatives:
            # Scored as evaluation scores it (the same positives and negatives).
            det = score_detection(
                method.detect, queries, self.data.qrels["valid"], negatives, self.params.detect_threshold
            )
            out |= {"detect_accuracy": det["accuracy"], "detect_f1": det["f1"], "detect_auroc": det["auroc"]}
            out["joint"] = joint_score(out["ndcg@3"], out["detect_accuracy"])
        return out

    def save_model(self, model: torch.nn.Module, path: str) -> None:
        model.save(path)
