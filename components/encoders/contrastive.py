"""The bi-encoder's contrastive training stage (dense's only stage, MassTool's semantic stage),
built inside each Ray Train worker.

It turns the training qrels into (query, positive tool, all relevant tools) examples, batches
them with pre-tokenized tool documents, and computes the in-batch text loss plus the ID-head loss
(see :func:`components.encoders.bi_encoder.contrastive_loss`).

Two settings make a pretrained backbone trainable on a CPU (``frozen_layers``, ``tool_vectors``):
the lowest layers' outputs are cached per text (:mod:`components.encoders.layer_cache`), and the
tools may be encoded once per epoch and scored as fixed vectors, every tool a negative.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import ray
import torch

from components.data import io
from components.data.tooltext import tool_texts
from components.data.types import Dataset
from components.encoders.bi_encoder import BiEncoder, contrastive_loss
from components.encoders.layer_cache import freeze_lower, lower_states, pad_states
from components.encoders.retriever import BiEncoderParams, BiEncoderRetriever
from components.metrics import EPOCH_METRICS, evaluate_retrieval

if TYPE_CHECKING:  # a type only: encoders sit beside training, not above it (see pyproject's contracts)
    from components.training.spec import StageConfig

TASK = "components.encoders.contrastive:ContrastiveTask"  # the import string a StageConfig names


class ContrastiveTask:
    """The contrastive training stage, built in each Ray Train worker (``config.params`` is a
    :class:`BiEncoderParams`; ``config.inputs.init_dir`` the bi-encoder to start from).

    It implements every member of :class:`components.training.task.StageTask`, the two hooks
    included, since it does not inherit the protocol's defaults.
    """

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self.params: BiEncoderParams = config.params
        data = config.inputs.dataset
        self.data: Dataset = ray.get(data) if isinstance(data, ray.ObjectRef) else data
        self.tool_ids: list[str] = list(self.data.corpus)
        self.tool_index = {t: i for i, t in enumerate(self.tool_ids)}
        # Tools no training query needs (in the cold-start split: the held-out ones, standing for
        # tools added later) are not candidates in training: scored against every tool each epoch,
        # they would be pushed down as negatives, a bias against exactly the tools cold start
        # measures (MassTool's joint stage masks them the same way).
        trained = self.data.trained_tools()
        self._untrained = torch.tensor([t not in trained for t in self.tool_ids])
        self._tool_texts = tool_texts(self.data.corpus, self.tool_ids, self.params.tool_fields)
        self._tokens: dict[str, torch.Tensor] | None = None
        self._query_states: dict[str, torch.Tensor] = {}  # text -> states after the frozen layers
        self._tool_states: list[torch.Tensor] = []
        self._tool_vectors: torch.Tensor | None = None  # tool_vectors "epoch": this epoch's tools

    def build_model(self) -> BiEncoder:
        assert self.config.inputs.init_dir is not None, "the contrastive stage starts from a saved bi-encoder"
        model = BiEncoder.load(io.fetch(self.config.inputs.init_dir, self.config.storage_options))
        # Tool documents are tokenized once; batches gather rows instead of re-tokenizing.
        self._tokens = model.encoder.tokenize(self._tool_texts, self.params.tool_max_length)
        self._tokenizer = model.encoder.tokenizer
        self._max_length = model.encoder.max_length
        # Corpus index -> row of the ID table (training tools only); -1 for tools without a row.
        row = {t: i for i, t in enumerate(model.id_tool_ids)}
        self._id_row = torch.tensor([row.get(t, -1) for t in self.tool_ids])
        if self.params.frozen_layers:
            freeze_lower(model.encoder, self.params.frozen_layers)
            model.frozen_layers = self.params.frozen_layers
        return model

    def cache_lower_states(self, model: BiEncoder) -> None:
        """The frozen layers' output is a fixed function of the text: computed once per training
        query (and tool, when tools are encoded per batch), on the model's device."""
        n = self.params.frozen_layers
        queries = sorted({self.data.queries[q] for q in self.data.qrels["train"]})
        self._query_states = dict(zip(queries, lower_states(model.encoder, queries, n), strict=True))
        if self.params.tool_vectors == "batch":
            self._tool_states = lower_states(model.encoder, self._tool_texts, n, self.params.tool_max_length)

    def train_data(self) -> list[tuple[str, int, tuple[int, ...]]]:
        out = []
        for qid, rel in self.data.qrels["train"].items():
            relevant = tuple(self.tool_index[t] for t, s in rel.items() if s > 0)
            out += [(self.data.queries[qid], pos, relevant) for pos in relevant]
        return out

    def collate(self, items: list[tuple[str, int, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
        assert self._tokens is not None, "build_model() runs before batches are made"
        texts = [q for q, _, _ in items]
        if self._query_states:
            states, mask = pad_states([self._query_states[q] for q in texts])
            batch = {"query_states": states, "query_mask": mask}
        else:
            tokens = self._tokenizer(
                texts, padding=True, truncation=True, max_length=self._max_length, return_tensors="pt"
            )
            batch = {"query_ids": tokens["input_ids"], "query_mask": tokens["attention_mask"]}
        positives = torch.tensor([p for _, p, _ in items])
        relevant = torch.zeros(len(items), len(self.tool_ids), dtype=torch.bool)
        for i, (_, _, rel) in enumerate(items):
            relevant[i, list(rel)] = True
        seen = self._id_row >= 0
        relevant_id = torch.zeros(len(items), int(seen.sum()), dtype=torch.bool)
        relevant_id[:, self._id_row[seen]] = relevant[:, seen]
        batch |= {"id_target": self._id_row[positives], "relevant_id": relevant_id}
        if self.params.tool_vectors == "epoch":
            # Scored against every tool's vector of this epoch: the target is the corpus index. The
            # untrained tools join the masked keys (never a target, so never a negative either).
            return batch | {"target": positives, "relevant_batch": relevant | self._untrained}
        unique, target = torch.unique(positives, return_inverse=True)
        batch |= {"target": target, "relevant_batch": relevant[:, unique]}
        if self._tool_states:
            states, mask = pad_states([self._tool_states[i] for i in unique.tolist()])
            return batch | {"tool_states": states, "tool_mask": mask}
        tool_mask = self._tokens["attention_mask"][unique]
        width = int(tool_mask.sum(1).max())
        # The corpus was padded to its longest tool; this batch needs only its own longest. The
        # padding is cut where the tokenizer put it: on the right for BERT, on the left for some.
        cut = slice(-width, None) if self._tokenizer.padding_side == "left" else slice(0, width)
        return batch | {
            "tool_ids": self._tokens["input_ids"][unique, cut],
            "tool_mask": tool_mask[:, cut],
        }

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        p = self.params
        query, tools, ids = model(
            batch.get("query_ids"),
            batch["query_mask"],
            batch.get("tool_ids"),
            batch.get("tool_mask"),
            query_states=batch.get("query_states"),
            tool_states=batch.get("tool_states"),
        )
        if tools is None:  # tool_vectors "epoch": this epoch's fixed vectors of every tool
            assert self._tool_vectors is not None, "start_epoch() encodes the tools first"
            tools = self._tool_vectors.to(query.device)
        loss = contrastive_loss(query, tools, batch["target"], batch["relevant_batch"], p.temperature)
        if ids is not None:
            loss = loss + p.id_loss_weight * contrastive_loss(
                query, ids, batch["id_target"], batch["relevant_id"], p.temperature
            )
        return loss

    def validate(self, model: torch.nn.Module) -> dict[str, float]:
        method = BiEncoderRetriever(self.params, model)
        method.index(self.data.corpus)
        out: dict[str, float] = {}
        for mode, mix in method.variants().items():
            method.mix = mix
            metrics = evaluate_retrieval(
                self.data.qrels["valid"], method.retrieve(self.data.split_queries("valid"), 10)
            )
            out |= {f"{mode}_{m}": metrics[m] for m in EPOCH_METRICS}
        # The score that ranks checkpoints: the best scoring mode on valid.
        out[self.params.select_metric] = max(
            v for k, v in out.items() if k.endswith(self.params.select_metric)
        )
        return out

    def save_model(self, model: torch.nn.Module, path: str) -> None:
        model.save(path)

    def param_groups(self, model: torch.nn.Module) -> Iterable[Any]:
        return model.parameters()

    def start_epoch(self, model: torch.nn.Module, epoch: int) -> None:
        """With ``tool_vectors: epoch``, encode every tool with the encoder as it is now; otherwise
        nothing to refresh (tool tokens are fixed and embeddings are computed per batch). With
        ``frozen_layers``, the first call caches the frozen layers' output (the model is on its
        device by then)."""
        if self.params.frozen_layers and not self._query_states:
            self.cache_lower_states(model)
        if self.params.tool_vectors == "epoch":
            self._tool_vectors = model.embed_texts(self._tool_texts, self.params.tool_max_length)
