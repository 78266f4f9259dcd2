"""MassTool (arXiv 2507.00487): multi-task search-based tool retrieval with tool-usage detection.

Two stages, each one Ray Train run through :func:`components.training.runner.run_stage`:

1. ``semantic`` — the dense bi-encoder's contrastive stage (text tower only) learns the query and
   tool encoder (:mod:`components.methods.dense_task`).
2. ``joint`` — the detection tower, QC-GCN, SUIM and AdaKT train together on
   ``L = L_retrieval + λ · L_detection + β · L_contrastive`` (:mod:`components.methods.masstool_task`),
   fine-tuning the encoder at a smaller learning rate.

Every module is a config switch for ablations (``graph``, ``suim``, ``dynamic_filter``, ``adakt``,
``contrastive_weight``, ``detection_weight``) and λ, β, ε, K (``neighbours``), L (``layers``) are
plain parameters for Tune sweeps. ``semantic_cache`` lets ablations share one semantic stage.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import ray
import torch

from components.data.tooltext import TOOL_FIELDS
from components.data.types import Corpus, Dataset, Queries, Results
from components.methods.base import RunSpec, read_config, write_config
from components.methods.dense import DenseMethod, DenseParams, tool_texts, top_k
from components.methods.masstool_model import ModelConfig
from components.methods.masstool_net import MassToolModel
from components.metrics import EPOCH_METRICS, check_select_metric
from components.registry import publish_dir
from components.training.inputs import share

if TYPE_CHECKING:
    from components.training.task import StageTask


# What the joint stage computes on valid every epoch (detection ones need valid no-tool queries).
# ``joint`` is the mean of ndcg@3 and detection accuracy: it selects the epoch that serves both
# towers, where retrieval alone saturates early (quickstart) while the detector is still learning.
JOINT_METRICS = (*EPOCH_METRICS, "ndcg@5", "detect_accuracy", "detect_f1", "detect_auroc", "joint")


@dataclass
class MassToolParams:
    """Hyper-parameters (the ``method.params`` config section). Model switches mirror ModelConfig."""

    # Semantic stage: the encoder spec and DenseParams overrides (epochs, lr, batch_size, ...).
    encoder: dict[str, Any] = field(default_factory=dict)
    semantic: dict[str, Any] = field(default_factory=dict)
    semantic_init: str | None = None  # start from this trained semantic-stage model dir instead
    semantic_cache: str | None = None  # reuse semantic stages with identical settings and data
    # Joint stage.
    epochs: int = 4
    batch_size: int = 256
    lr: float = 1e-3
    encoder_lr: float = 1e-4
    weight_decay: float = 0.0
    finetune_encoder: bool = True
    detection_weight: float = 0.5  # λ
    contrastive_weight: float = 0.1  # β
    detect_threshold: float = 0.5
    # Model (see components.methods.masstool_model.ModelConfig).
    dim: int = 128
    detection_hidden: int = 128
    layers: int = 2  # L
    edge_dropout: float = 0.1
    graph: bool = True
    cl_temperature: float = 0.2
    hide_batch_edges: bool = True  # leave a training query's own edges out of its step's graph
    suim: bool = True
    neighbours: int = 10  # K
    epsilon: float = 0.5  # ε
    dynamic_filter: bool = True
    adakt: str = "gate"
    temperature: float = 0.05
    tool_fields: tuple[str, ...] = TOOL_FIELDS
    tool_max_length: int = 96
    select_metric: str = "ndcg@3"
    progress: bool = False

    def __post_init__(self) -> None:
        check_select_metric("masstool", self.select_metric, JOINT_METRICS)

    def model_config(self) -> ModelConfig:
        """The architecture part of these parameters."""
        names = {f.name for f in fields(ModelConfig)}
        return ModelConfig(
            **{k: v for k, v in asdict(self).items() if k in names},
            contrastive=self.contrastive_weight > 0,
        )

    def dense_params(self) -> DenseParams:
        """The semantic stage's settings: the dense text tower (no ID head: the graph learns ids)."""
        base = {
            "encoder": self.encoder,
            "id_head": False,
            "epochs": 3,
            "tool_fields": self.tool_fields,
            "tool_max_length": self.tool_max_length,
            # No ``select_metric`` here: the stage selects on its own (``semantic.select_metric``,
            # DenseParams' default), since the joint stage's metric, e.g. detection accuracy, is
            # one a text-only stage does not report.
        }
        return DenseParams(**{**base, **self.semantic})


# Bumped when the semantic stage's code changes what it produces for equal settings and data, so
# that no cached encoder from older code is reused (2: deterministic tokenizer learning).
SEMANTIC_CACHE_VERSION = 2

TOOL_INDEX = "tool_embeddings.npy"
QUERY_GRAPH = "query_graph.npy"


class MassToolMethod:
    """Detection tower + query-centric graph retrieval tower (see module docstring)."""

    name: ClassVar[str] = "masstool"
    stages: ClassVar[tuple[str, ...]] = ("semantic", "joint")

    def __init__(self, **params: Any) -> None:
        params = {k: tuple(v) if k == "tool_fields" else v for k, v in params.items()}
        self.params = MassToolParams(**params)
        self.params.model_config()  # validate switches early, before any training
        self.model: MassToolModel | None = None
        self.semantic_dir: str | None = self.params.semantic_init
        self.tool_ids: list[str] = []
        self._tools: torch.Tensor | None = None
        self._query_graph: torch.Tensor | None = None

    @classmethod
    def from_model(cls, model: MassToolModel, params: MassToolParams) -> MassToolMethod:
        method = cls(**asdict(params))
        method.model = model
        return method

    @classmethod
    def stage_task(cls, stage: str, config: dict[str, Any]) -> StageTask:
        """The worker-side task of ``stage``: the dense contrastive task, or the joint MassTool task."""
        if stage == "semantic":
            from components.methods.dense_task import DenseTask

            return DenseTask(config)
        if stage == "joint":
            from components.methods.masstool_task import MassToolTask

            return MassToolTask(config)
        raise ValueError(f"masstool has stages {cls.stages}, not {stage!r}")

    def config(self) -> dict[str, Any]:
        return asdict(self.params)

    # ----------------------------------------------------------------- training
    def fit(self, stage: str, data: Dataset, run: RunSpec) -> dict[str, float]:
        """Run ``semantic`` (or reuse it) then ``joint``; each is one Ray Train run."""
        from components.training.runner import run_stage

        if stage == "semantic":
            return self._fit_semantic(data, run)
        if stage != "joint":
            raise ValueError(f"masstool has stages {self.stages}, not {stage!r}")
        if self.semantic_dir is None:
            raise RuntimeError("masstool: run the semantic stage (or set semantic_init) before joint")
        metric = self.params.select_metric
        if (metric.startswith("detect_") or metric == "joint") and not data.neg_split.get("valid"):
            raise ValueError(
                f"masstool: select_metric {metric!r} needs no-tool queries in the "
                "valid split, and this dataset has none"
            )
        params = asdict(self.params)
        semantic = share(self.semantic_dir, run, f"{run.name}-semantic")
        loop = {**params, "params": params, "semantic_dir": semantic, "dataset": ray.put(data)}
        result = run_stage(self.name, stage, loop, run, score=f"valid_{self.params.select_metric}")
        self.model = MassToolModel.load(result.model_dir)
        return {**result.metrics, "stage_seconds": result.seconds}

    def _semantic_key(self, data: Dataset, seed: int) -> str:
        """Cache key: the semantic settings, the seed and the content the stage trains and selects on.

        Hashing the train/valid judgements, their query texts and the tool texts (not just row
        counts) means a different split seed or an edited dataset never reuses an encoder that was
        trained on what is now the validation split.
        """
        settings = [SEMANTIC_CACHE_VERSION, asdict(self.params.dense_params()), data.name, seed]
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
        for split in ("train", "valid"):
            for qid, rel in sorted(data.qrels.get(split, {}).items()):
                row = [split, qid, data.queries.get(qid, ""), sorted(rel.items())]
                digest.update(json.dumps(row).encode())
        tool_ids = sorted(data.corpus)
        texts = tool_texts(data.corpus, tool_ids, self.params.tool_fields)
        for tid, text in zip(tool_ids, texts, strict=True):
            digest.update(json.dumps([tid, text]).encode())
        return digest.hexdigest()[:16]

    def _fit_semantic(self, data: Dataset, run: RunSpec) -> dict[str, float]:
        from components.training.runner import run_stage

        if self.params.semantic_init:
            self.semantic_dir = self.params.semantic_init
            return {"reused": 1.0}
        cached = None
        if self.params.semantic_cache:
            cached = os.path.join(
                os.path.abspath(self.params.semantic_cache), self._semantic_key(data, run.seed)
            )
            if os.path.exists(os.path.join(cached, "bi_encoder.json")):
                self.semantic_dir = cached
                return {"reused": 1.0}
        dense = DenseMethod(**asdict(self.params.dense_params()))
        init_dir = os.path.join(run.local_dir, f"{run.name}-semantic-init")
        dense.initial_model(data, init_dir, run.seed)
        loop = dense.loop_config(share(init_dir, run, f"{run.name}-semantic-init"), ray.put(data))
        result = run_stage(self.name, "semantic", loop, run, score=f"valid_{dense.params.select_metric}")
        self.semantic_dir = result.model_dir
        if cached:
            publish_dir(result.model_dir, cached)
            self.semantic_dir = cached
        return {**result.metrics, "stage_seconds": result.seconds}

    # ---------------------------------------------------------------- inference
    def _need_model(self) -> MassToolModel:
        if self.model is None:
            raise RuntimeError("masstool: train (fit) or load a model first")
        return self.model

    def index(self, corpus: Corpus) -> None:
        """Embed the catalogue: graph embeddings for trained tools, text for tools added later."""
        model = self._need_model().eval()
        self.tool_ids = list(corpus)
        text = model.embed(
            tool_texts(corpus, self.tool_ids, self.params.tool_fields), self.params.tool_max_length
        )
        tools, query_graph = model.tool_index(self.tool_ids, text)
        self._tools, self._query_graph = tools.cpu(), query_graph

    def _refresh_graph(self) -> None:
        """The training queries' graph embeddings over the training-time tool texts (no index yet)."""
        with torch.no_grad():
            self._query_graph = self._need_model().eval().graph()[0]

    def _joint(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Detection logits and joint embeddings of new queries (SUIM searches the training pool)."""
        model = self._need_model().eval()
        assert self._query_graph is not None
        device = self._query_graph.device  # the model's: CUDA inside a GPU training worker
        logits, joints = [], []
        with torch.no_grad():
            for i in range(0, len(texts), 1024):
                semantic = model.embed(texts[i : i + 1024]).to(device)
                logit, e = model.joint(semantic, self._query_graph)
                logits.append(logit.cpu())
                joints.append(e.cpu())
        return torch.cat(logits), torch.cat(joints)

    def retrieve(self, queries: Queries, k: int) -> Results:
        if self._tools is None:
            raise RuntimeError("masstool: call index() before retrieve()")
        qids = list(queries)
        if not qids:
            return {}
        _, joint = self._joint([queries[q] for q in qids])
        return top_k(self._need_model().scores(joint, self._tools), qids, self.tool_ids, k)

    def detect(self, queries: Queries) -> dict[str, float]:
        """Probability that each query needs a tool (the detection tower)."""
        qids = list(queries)
        if not qids:
            return {}
        if self._query_graph is None:
            self._refresh_graph()
        logits, _ = self._joint([queries[q] for q in qids])
        return dict(zip(qids, torch.sigmoid(logits).tolist(), strict=True))

    # ------------------------------------------------------------- persistence
    def save(self, path: str) -> None:
        """``config.json`` + the model (encoder HF layout, heads safetensors, graph npz) + the index:
        tool vectors and the training queries' graph embeddings of the same propagation."""
        if self._tools is None or self._query_graph is None:
            raise RuntimeError("masstool: nothing to save; fit/load and index first")
        write_config(path, {"method": self.name, **self.config(), "tool_ids": self.tool_ids})
        self._need_model().save(os.path.join(path, "model"))
        np.save(os.path.join(path, TOOL_INDEX), self._tools.numpy())
        np.save(os.path.join(path, QUERY_GRAPH), self._query_graph.cpu().numpy())

    @classmethod
    def load(cls, path: str) -> MassToolMethod:
        config = read_config(path)
        tool_ids = config.pop("tool_ids")
        config.pop("method")
        method = cls(**config)
        method.model = MassToolModel.load(os.path.join(path, "model")).eval()
        method.tool_ids = tool_ids
        method._tools = torch.from_numpy(np.load(os.path.join(path, TOOL_INDEX)))
        graph_file = os.path.join(path, QUERY_GRAPH)
        if os.path.exists(graph_file):
            method._query_graph = torch.from_numpy(np.load(graph_file))
        else:  # artifacts written before the query graph was saved with the index
            method._refresh_graph()
        return method
