"""MassTool (arXiv 2507.00487): multi-task search-based tool retrieval with tool-usage detection.

Two stages, each one Ray Train run through :func:`components.training.runner.run_stage`:

1. ``semantic`` — the dense bi-encoder's contrastive stage (text tower only) learns the query and
   tool encoder (:mod:`components.encoders.contrastive`, shared with the dense method).
2. ``joint`` — the detection tower, QC-GCN, SUIM and AdaKT train together on
   ``L = L_retrieval + λ · L_detection + β · L_contrastive`` (:mod:`.task`),
   fine-tuning the encoder at a smaller learning rate.

Every module is a config switch for ablations (``graph``, ``suim``, ``dynamic_filter``, ``adakt``,
``contrastive_weight``, ``detection_weight``) and λ, β, ε, K (``neighbours``), L (``layers``) are
plain parameters for Tune sweeps. ``semantic_cache`` lets ablations share one semantic stage.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, replace
from typing import Any, ClassVar

import numpy as np
import ray
import torch

from components.data.io import publish_dir
from components.data.tooltext import tool_texts
from components.data.types import Corpus, Dataset, Queries, Results
from components.encoders import contrastive
from components.encoders.retriever import initial_bi_encoder, top_k
from components.encoders.text_encoder import TextEncoder
from components.methods.base import read_config, write_config
from components.methods.masstool.model import MassToolModel
from components.methods.masstool.params import MassToolParams
from components.training.inputs import share
from components.training.spec import RunSpec, StageConfig, StageInputs

JOINT_TASK = "components.methods.masstool.task:MassToolTask"


# Bumped when the semantic stage's code changes what it produces for equal settings and data, so
# that no cached encoder from older code is reused (2: deterministic tokenizer learning; 3: even
# batches instead of drop_last, and a tokenizer learnt from the known tools only).
SEMANTIC_CACHE_VERSION = 3

TOOL_INDEX = "tool_embeddings.npy"
QUERY_GRAPH = "query_graph.npy"


class MassToolMethod:
    """Detection tower + query-centric graph retrieval tower (see module docstring)."""

    name: ClassVar[str] = "masstool"
    stages: ClassVar[tuple[str, ...]] = ("semantic", "joint")
    # cold_start: a tool added after training gets its vector from its text (the frozen entry).
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"train", "detect", "cold_start", "text_encoders", "exact_scores", "shared_stages"}
    )

    def __init__(self, **params: Any) -> None:
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

    def config(self) -> dict[str, Any]:
        return asdict(self.params)

    def text_encoders(self) -> list[TextEncoder]:
        """The encoder both towers share (after fit or load)."""
        if self.model is None:
            raise RuntimeError("masstool: train (fit) or load a model first")
        return [self.model.encoder]

    @property
    def detect_threshold(self) -> float:
        """The probability from which :meth:`detect` says a query needs a tool."""
        return self.params.detect_threshold

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
        inputs = StageInputs(ray.put(data), share(self.semantic_dir, run, f"{run.name}-semantic"))
        params = self.params
        if params.embedding_cache:  # the driver's directory, whatever the worker's working directory
            params = replace(params, embedding_cache=os.path.abspath(params.embedding_cache))
        config = StageConfig.from_params(JOINT_TASK, "joint", params, inputs)
        result = run_stage(config, run)
        self.model = MassToolModel.load(result.model_dir)
        if self.params.embedding_cache:  # the driver scores the model next: the same texts again
            self.model.use_embedding_cache(self.params.embedding_cache)
        return {**result.metrics, "stage_seconds": result.seconds}

    def _semantic_key(self, data: Dataset, seed: int) -> str:
        """Cache key: the semantic settings, the seed and the content the stage trains and selects on.

        Hashing the train/valid judgements, their query texts and the tool texts (not just row
        counts) means a different split seed or an edited dataset never reuses an encoder that was
        trained on what is now the validation split.
        """
        # The tools known at training time decide the scratch tokenizer's texts (cold start).
        settings = [SEMANTIC_CACHE_VERSION, self._semantic_settings(), data.name, seed, data.known_tools()]
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

    def _semantic_settings(self) -> dict[str, Any]:
        # How the tool vectors are searched does not change what the stage trains: index_* stay out.
        return {k: v for k, v in asdict(self.params.dense_params()).items() if not k.startswith("index_")}

    def stage_settings(self, stage: str, seed: int) -> dict[str, Any]:
        """What a cached ``stage`` is keyed by besides the data (capability ``shared_stages``):
        a Tune sweep's trials that agree on it reuse one training of the semantic stage.

        Raises:
            ValueError: the stage is not cached (the joint stage; the semantic one without
                ``semantic_cache`` or ``semantic_init``), so every trial would train it.
        """
        if stage == "semantic" and self.params.semantic_init:
            return {"semantic_init": self.params.semantic_init}
        if stage == "semantic" and self.params.semantic_cache:
            return {"settings": self._semantic_settings(), "seed": seed}
        why = "set method.params.semantic_cache" if stage == "semantic" else "only the semantic stage is"
        raise ValueError(f"masstool: the {stage!r} stage is not cached ({why})")

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
        dense = self.params.dense_params()
        init_dir = os.path.join(run.local_dir, f"{run.name}-semantic-init")
        initial_bi_encoder(dense, data, init_dir, run.seed)
        inputs = StageInputs(ray.put(data), share(init_dir, run, f"{run.name}-semantic-init"))
        config = StageConfig.from_params(contrastive.TASK, "semantic", dense, inputs)
        result = run_stage(config, run)
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

    def _eval_model(self) -> MassToolModel:
        """The model in eval mode; switched only when it is training, since ``eval()`` walks every
        submodule on each served query otherwise (~0.2 ms for MiniLM here)."""
        model = self._need_model()
        return model.eval() if model.training else model

    def index(self, corpus: Corpus) -> None:
        """Embed the catalogue: graph embeddings for trained tools, text for tools added later."""
        model = self._eval_model()
        self.tool_ids = list(corpus)
        text = model.embed(
            tool_texts(corpus, self.tool_ids, self.params.tool_fields), self.params.tool_max_length
        )
        tools, query_graph = model.tool_index(self.tool_ids, text)
        self._tools, self._query_graph = tools.cpu(), query_graph

    def _refresh_graph(self) -> None:
        """The training queries' graph embeddings over the training-time tool texts (no index yet)."""
        with torch.no_grad():
            self._query_graph = self._eval_model().graph()[0]

    def _joint(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Detection logits and joint embeddings of new queries (SUIM searches the training pool)."""
        model = self._eval_model()
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
        return self.retrieve_detected(queries, k)[0]  # the detection logits come with the pass

    def detect(self, queries: Queries) -> dict[str, float]:
        """Probability that each query needs a tool (the detection tower)."""
        qids = list(queries)
        if not qids:
            return {}
        if self._query_graph is None:
            self._refresh_graph()
        logits, _ = self._joint([queries[q] for q in qids])
        return probabilities(qids, logits)

    def retrieve_detected(self, queries: Queries, k: int) -> tuple[Results, dict[str, float]]:
        """:meth:`retrieve` and :meth:`detect` from one pass: both towers read the query's joint
        embedding, so a server answering both need not encode the query twice."""
        if self._tools is None:
            raise RuntimeError("masstool: call index() before retrieve()")
        qids = list(queries)
        if not qids:
            return {}, {}
        logits, joint = self._joint([queries[q] for q in qids])
        found = top_k(self._need_model().scores(joint, self._tools), qids, self.tool_ids, k)
        return found, probabilities(qids, logits)

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


def probabilities(qids: list[str], logits: torch.Tensor) -> dict[str, float]:
    """The detection tower's P(needs a tool) per query id, from its logits."""
    return dict(zip(qids, torch.sigmoid(logits).tolist(), strict=True))
