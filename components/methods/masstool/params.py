"""MassTool's settings (the ``method.params`` config section), arXiv 2507.00487."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from components.data.tooltext import TOOL_FIELDS, tool_field_names
from components.encoders.retriever import BiEncoderParams
from components.methods.masstool.layers import ModelConfig
from components.metrics import EPOCH_METRICS, check_select_metric

# What the joint stage computes on valid every epoch (detection ones need valid no-tool queries).
# ``joint`` is the mean of ndcg@3 and detection accuracy: it selects the epoch that serves both
# towers, where retrieval alone saturates early (quickstart) while the detector is still learning.
JOINT_METRICS = (*EPOCH_METRICS, "ndcg@5", "detect_accuracy", "detect_f1", "detect_auroc", "joint")


@dataclass
class MassToolParams:
    """Hyper-parameters (the ``method.params`` config section). Model switches mirror ModelConfig."""

    # Semantic stage: the encoder spec and BiEncoderParams overrides (epochs, lr, batch_size, ...).
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
    # With a frozen encoder: a directory where its embeddings are kept, keyed by its weights and the
    # texts, so that epochs, runs and Tune trials embed each text once (None: embed every time).
    embedding_cache: str | None = None
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
    tool_dropout: float = 0.0  # share of trained tools made text-only each step (cold-start training)
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
        self.tool_fields = tool_field_names(self.tool_fields, "masstool")
        for name in ("temperature", "cl_temperature"):
            # Both divide logits: 0 trains on NaN, a negative one pushes the positives apart.
            if not getattr(self, name) > 0:
                raise ValueError(f"masstool: {name} must be > 0; got {getattr(self, name)}")
        if self.embedding_cache and self.finetune_encoder:
            raise ValueError(
                "masstool: embedding_cache needs finetune_encoder: false (a fine-tuned encoder's "
                "embeddings change every step, there is nothing to cache)"
            )

    def model_config(self) -> ModelConfig:
        """The architecture part of these parameters."""
        names = {f.name for f in fields(ModelConfig)}
        return ModelConfig(
            **{k: v for k, v in asdict(self).items() if k in names},
            contrastive=self.contrastive_weight > 0,
        )

    def dense_params(self) -> BiEncoderParams:
        """The semantic stage's settings: the dense text tower (no ID head: the graph learns ids)."""
        base = {
            "encoder": self.encoder,
            "id_head": False,
            "epochs": 3,
            "tool_fields": self.tool_fields,
            "tool_max_length": self.tool_max_length,
            # No ``select_metric`` here: the stage selects on its own (``semantic.select_metric``,
            # BiEncoderParams' default), since the joint stage's metric, e.g. detection accuracy, is
            # one a text-only stage does not report.
        }
        return BiEncoderParams(**{**base, **self.semantic})
