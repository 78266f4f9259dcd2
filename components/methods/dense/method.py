"""Dense retrieval: a bi-encoder trained with in-batch negatives, plus an optional tool-ID head.

The text tower follows the dense baselines of the tool-retrieval papers (COLT, CIKM 2024;
MassTool, arXiv 2507.00487): queries and tool documents share an encoder, trained with the
multiple-negatives ranking loss, with other relevant tools of a multi-tool query masked out of the
negatives. The ID head (one learned vector per training tool) adds a classifier-style score;
``mix`` weighs the two at retrieval time and is selected on valid. Unseen tools (cold start) have
no ID vector and are scored by their text alone.

The model, its scoring and its training task are shared with MassTool's semantic stage and live
in :mod:`components.encoders` (``bi_encoder``, ``retriever``, ``contrastive``); this package is
the method around them: its stage, its artifact and its registry entry.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any, ClassVar

import numpy as np
import ray
import torch

from components.data.types import Dataset
from components.encoders import contrastive
from components.encoders.bi_encoder import BiEncoder
from components.encoders.retriever import (
    BiEncoderParams,
    BiEncoderRetriever,
    build_bi_encoder,
    initial_bi_encoder,
)
from components.encoders.text_encoder import TextEncoder
from components.methods.base import read_config, write_config
from components.training.inputs import share
from components.training.spec import RunSpec, StageConfig, StageInputs

DenseParams = BiEncoderParams  # the ``method.params`` section of ``method.name: dense``


class DenseMethod(BiEncoderRetriever):
    """Bi-encoder dense retrieval with an optional tool-ID head (see module docstring)."""

    name: ClassVar[str] = "dense"
    stages: ClassVar[tuple[str, ...]] = ("contrastive",)
    # variants: text tower, ID head and their mix are each a scoring mode bench reports;
    # cold_start: tools added after training are scored by their text.
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"train", "variants", "cold_start", "text_encoders", "exact_scores"}
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(DenseParams(**params))

    @classmethod
    def from_model(cls, model: BiEncoder, params: DenseParams) -> DenseMethod:
        method = cls(**asdict(params))
        method.model = model
        return method

    def config(self) -> dict[str, Any]:
        return {**asdict(self.params), "mix": self.mix}

    def text_encoders(self) -> list[TextEncoder]:
        """The one encoder of queries and tools (after fit or load)."""
        if self.model is None:
            raise RuntimeError("dense: train (fit) or load a model first")
        return [self.model.encoder]

    def initial_model(self, data: Dataset, path: str, seed: int) -> None:
        """Train the tokenizer on tools + training queries, build the model, save it to ``path``."""
        initial_bi_encoder(self.params, data, path, seed)

    def stage_config(self, init_dir: str, dataset: Dataset | ray.ObjectRef) -> StageConfig:
        """The contrastive stage starting from the bi-encoder in ``init_dir``."""
        return StageConfig.from_params(
            contrastive.TASK, "contrastive", self.params, StageInputs(dataset, init_dir)
        )

    def fit(self, stage: str, data: Dataset, run: RunSpec) -> dict[str, float]:
        """Run the contrastive stage on Ray Train, keep the best checkpoint, select ``mix`` on valid."""
        from components.training.runner import run_stage

        if stage not in self.stages:
            raise ValueError(f"dense has stages {self.stages}, not {stage!r}")
        if self.params.epochs == 0:
            # Zero-shot: a pretrained encoder as it ships (e.g. ``encoder: minilm``), no training.
            self.model = build_bi_encoder(self.params, data, run.seed).eval()
            return {"mix": self.mix, "stage_seconds": 0.0}
        init_dir = os.path.join(os.path.abspath(run.local_dir), f"{run.name}-init")
        self.initial_model(data, init_dir, run.seed)
        config = self.stage_config(share(init_dir, run, f"{run.name}-init"), ray.put(data))
        result = run_stage(config, run)
        self.model = BiEncoder.load(result.model_dir).eval()  # used from here on, as a loaded one is
        self.select_mix(data)
        return {**result.metrics, "mix": self.mix, "stage_seconds": result.seconds}

    def save(self, path: str) -> None:
        """``config.json`` + the bi-encoder (HF encoder, safetensors heads) + the tool index (.npy)."""
        if self.model is None or self._tools is None:
            raise RuntimeError("dense: nothing to save; fit/load and index first")
        write_config(path, {"method": self.name, **self.config(), "tool_ids": self.tool_ids})
        self.model.save(os.path.join(path, "model"))
        np.save(os.path.join(path, "tool_embeddings.npy"), self._tools.numpy())

    @classmethod
    def load(cls, path: str) -> DenseMethod:
        config = read_config(path)
        tool_ids, mix = config.pop("tool_ids"), config.pop("mix")
        config.pop("method")
        config = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
        method = cls(**config)
        # A loaded model is served: eval mode for good, so no call toggles dropout on and off (one
        # thread's train() mid-way through another's forward would make its vectors random).
        method.model = BiEncoder.load(os.path.join(path, "model")).eval()
        method.mix = mix
        method.tool_ids = tool_ids
        method._tools = torch.from_numpy(np.load(os.path.join(path, "tool_embeddings.npy")))
        method.index_ids()
        return method
