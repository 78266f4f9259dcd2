"""Hyper-parameters of ToolWeaver (the ``method.params`` config section), shared by driver and workers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from components.config import is_number, whole
from components.encoders.text_encoder import EncoderSpec, spec_from
from components.generative.params import DEFAULT_STAGES, LM_STAGES, CodeLMParams

# The quantizer stage ("codes") runs first; the LM stages are ToolGen's (see CodeLMParams).
STAGES = ("codes", *LM_STAGES)
# One quantizer "epoch" is ``passes_per_epoch`` passes over the tools: a few hundred tools make a
# couple of batches, and a checkpoint plus validation per couple of steps would cost more than them.
TOOLWEAVER_STAGES: dict[str, dict[str, Any]] = {
    "codes": {"epochs": 8, "lr": 1.0e-3, "batch_size": 256},
    **DEFAULT_STAGES,
}
NORMALISATIONS = ("symmetric", "row", "none")
CODE_INITS = ("sampled", "names")


@dataclass
class ToolWeaverParams(CodeLMParams):
    """ToolWeaver settings: the shared code-LM settings plus the tool vectors and the quantizer.

    Attributes:
        encoder: The pretrained text encoder that embeds each tool's text (``minilm``: the paper
            uses all-mpnet-base-v2; any ``from_pretrained`` name or local directory).
        encoder_max_length: Tokens of tool text the encoder reads.
        embed_actors: Ray Data actors embedding the catalog in parallel.
        levels: L, codebooks (code length in tokens).
        codebook_size: K, codes per codebook; L×K new tokens, K^L addresses.
        hidden_dims / latent_dim: The quantizer's MLP encoder (mirrored by its decoder).
        beta: Commitment weight of the residual quantizer.
        collab_weight: λ, weight of the co-occurrence term Σ A_uv ‖ẑ_u − ẑ_v‖².
        collab_scale: ``batch`` (the committed figures): the term over a batch's co-used pairs,
            on average (B − 1)/(N − 1) of the whole per-tool term for batches of B over N tools,
            so a λ acts more weakly on a larger catalogue; ``catalog`` multiplies it by
            (N − 1)/(B − 1), so one λ means the same on any catalogue.
        cooccurrence_norm: How the tool–tool counts A are normalised: ``symmetric``
            (D^-1/2 A D^-1/2, the normalised-Laplacian weights), ``row`` (D^-1 A) or ``none``.
        sinkhorn_epsilon: ε, entropy of Sinkhorn–Knopp balancing at the last level (0 disables:
            plain nearest-code assignment).
        sinkhorn_iters: Sinkhorn–Knopp iterations.
        kmeans_iters: k-means iterations of the codebook initialisation on the first batch.
        passes_per_epoch: Passes over the tools per quantizer epoch (see ``TOOLWEAVER_STAGES``).
        code_init: Where the code tokens' rows start: ``sampled`` (around the vocabulary's mean
            row, every code alike) or ``names`` (each code at the mean name row of the tools it
            spells, ToolGen's initialisation carried to shared codes; see
            :func:`components.generative.tool_tokens.init_code_rows`).
    """

    method: ClassVar[str] = "toolweaver"
    STAGES: ClassVar[tuple[str, ...]] = STAGES
    DEFAULT_STAGES: ClassVar[dict[str, dict[str, Any]]] = TOOLWEAVER_STAGES

    encoder: dict[str, Any] | str = field(default_factory=lambda: {"name_or_path": "minilm"})
    encoder_max_length: int = 128
    embed_actors: int = 1
    levels: int = 2
    codebook_size: int = 32
    hidden_dims: tuple[int, ...] = (256, 128)
    latent_dim: int = 64
    beta: float = 0.25
    collab_weight: float = 0.1
    collab_scale: str = "batch"
    cooccurrence_norm: str = "symmetric"
    sinkhorn_epsilon: float = 0.03
    sinkhorn_iters: int = 50
    kmeans_iters: int = 20
    passes_per_epoch: int = 50
    code_init: str = "sampled"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.hidden_dims = tuple(int(h) for h in self.hidden_dims)
        spec = self.encoder_spec()  # validates the encoder section on the driver
        if not spec.name_or_path:
            raise ValueError("toolweaver: encoder.name_or_path is required (e.g. 'minilm')")
        if self.levels < 1 or self.codebook_size < 2:
            raise ValueError(
                "toolweaver: levels must be >= 1 and codebook_size >= 2, "
                f"got {self.levels}, {self.codebook_size}"
            )
        if self.decoding == "unconstrained" and self.free_max_new_tokens < self.levels:
            # Free outputs stopped short of a whole code: every one parsed as no tool, recall 0.
            raise ValueError(
                f"toolweaver: free_max_new_tokens ({self.free_max_new_tokens}) must be >= levels "
                f"({self.levels}) to decode unconstrained: a code is {self.levels} tokens"
            )
        weights = (self.collab_weight, self.sinkhorn_epsilon, self.beta)
        if not all(is_number(w) and math.isfinite(w) and w >= 0 for w in weights):
            raise ValueError(
                "toolweaver: collab_weight, sinkhorn_epsilon and beta must be finite numbers >= 0, "
                f"got {weights}"
            )
        # Below this -cost/ε overflows float32 (NaN plans, every code 0); ε = 0 turns balancing off.
        if 0 < self.sinkhorn_epsilon < 1e-6:
            raise ValueError(
                f"toolweaver: sinkhorn_epsilon must be 0 or >= 1e-6, got {self.sinkhorn_epsilon}"
            )
        # sinkhorn_iters 0 with ε > 0 turned balancing off without a word.
        whole("toolweaver: sinkhorn_iters", self.sinkhorn_iters, 1 if self.sinkhorn_epsilon > 0 else 0)
        whole("toolweaver: kmeans_iters", self.kmeans_iters, 0)
        for key in ("latent_dim", "passes_per_epoch", "embed_actors", "encoder_max_length"):
            whole(f"toolweaver: {key}", getattr(self, key), 1)
        if any(h < 1 for h in self.hidden_dims):
            raise ValueError(f"toolweaver: hidden_dims must be sizes >= 1, got {list(self.hidden_dims)}")
        if self.stages["codes"].get("max_examples") is not None:
            # The quantizer trains on every tool; nothing reads a cap there.
            raise ValueError("toolweaver: stages.codes takes no max_examples (it trains on every tool)")
        if self.collab_scale not in ("batch", "catalog"):
            raise ValueError(
                f"toolweaver: collab_scale must be 'batch' or 'catalog', got {self.collab_scale!r}"
            )
        if self.code_init not in CODE_INITS:
            raise ValueError(f"toolweaver: code_init must be one of {CODE_INITS}, got {self.code_init!r}")
        if self.cooccurrence_norm not in NORMALISATIONS:
            raise ValueError(
                f"toolweaver: cooccurrence_norm must be one of {NORMALISATIONS}, "
                f"got {self.cooccurrence_norm!r}"
            )

    def encoder_spec(self) -> EncoderSpec:
        spec = spec_from(self.encoder)
        spec.max_length = self.encoder_max_length
        return spec
