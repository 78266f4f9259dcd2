"""Settings every code-generating retriever shares (ToolGen, ToolWeaver): the LM, its stages, prompts.

Both methods fine-tune a causal LM through the same stages (ToolGen, arXiv 2410.03439, Sec. 3.2:
memorization, retrieval, agent tuning; ToolWeaver, arXiv 2601.21947, keeps them with multi-token
codes), after a plain-text warm-up when the LM is built here from scratch. A method's own params
dataclass subclasses :class:`CodeLMParams`, naming itself (``method``) and adding its own fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from components.config import is_number, whole
from components.data.tooltext import TOOL_FIELDS, tool_field_names
from components.generative.engines import check_engine, check_engine_endpoint
from components.generative.lora import LoraSpec, lora_spec_from
from components.metrics import check_select_metric

# Stage order: an LM warm-up on plain text (only when the LM is built here from scratch), then
# the three fine-tuning stages. Each is one Ray Train run.
LM_STAGES = ("warmup", "memorization", "retrieval", "agent")

# Per-stage loop settings; ``max_examples`` caps the stage's training queries (a seeded sample):
# the agent stage's trajectories, and the warm-up's queries, which come on top of every tool document.
DEFAULT_STAGES: dict[str, dict[str, Any]] = {
    "warmup": {"epochs": 1, "lr": 1.0e-3, "batch_size": 64, "max_examples": 6000},
    # A 4-layer, 256-wide Llama (constant AdamW lr): at 1e-3 memorization stayed at chance on ToolLens
    # and 2e-3 broke retrieval; 2.5e-4-3e-4 learn both (valid split).
    "memorization": {"epochs": 12, "lr": 3.0e-4, "batch_size": 16},
    # Valid N@3 on ToolLens rose 0.80 -> 0.87 -> 0.91 over 3 epochs (benchmarks/results/toollens_toolgen*).
    "retrieval": {"epochs": 6, "lr": 2.5e-4, "batch_size": 32},
    "agent": {"epochs": 1, "lr": 1.0e-4, "batch_size": 32, "max_examples": 2000},
}
STAGE_KEYS = {"epochs", "lr", "batch_size", "weight_decay", "max_examples"}


@dataclass
class CodeLMParams:
    """Settings of an LM that retrieves tools by generating their codes.

    Attributes:
        lm: :class:`components.generative.lm.LMSpec` fields; ``name_or_path`` loads a hub model
            (``llama-3-8b`` as in the paper, ``smollm2-135m``...), else a small Llama is built here.
        stages: Per-stage ``epochs``, ``lr``, ``batch_size``, ``weight_decay``, ``max_examples``,
            merged over the class's ``DEFAULT_STAGES``; ``epochs: 0`` skips a stage.
        agent_replay: Retrieval examples mixed into agent tuning, per trajectory, so that the
            query -> tool prompt is not forgotten while the agent format is learned (0 disables).
        decoding: ``constrained`` (trie beam search, only real tools) or ``unconstrained``
            (free beam search; outputs that name no tool are dropped and counted as hallucinations).
        num_beams: Beams for retrieval (at least ``k`` are used).
        free_max_new_tokens: Longest free (unconstrained) output, in tokens.
        valid_queries: Cap on valid queries scored per epoch for checkpoint choice (None = all).
        perplexity_texts: Valid queries whose perplexity is reported before/after (0 skips it).
        engine: What runs the constrained decoder at inference: ``transformers`` (PyTorch, CPU or
            GPU) or ``llama.cpp`` (the trained LM exported to GGUF, CPU; free decoding stays on
            transformers). Training always uses PyTorch.
        engine_dtype: The GGUF's weights for ``llama.cpp``: ``f32`` or ``f16``.
        engine_threads: llama.cpp's CPU threads (None: its default, half the cores).
        engine_endpoint: For ``vllm``: where this method's trained LM (``<artifact>/lm``) is served,
            ``{"endpoint": "http://host:8000/v1", "model": <served name>}`` (+ ``api_key_env``,
            ``timeout_s``, ``concurrency``), see :mod:`components.generative.vllm_scorer`.
    """

    method: ClassVar[str] = "codelm"
    STAGES: ClassVar[tuple[str, ...]] = LM_STAGES
    DEFAULT_STAGES: ClassVar[dict[str, dict[str, Any]]] = DEFAULT_STAGES
    STAGE_KEYS: ClassVar[set[str]] = STAGE_KEYS

    lm: dict[str, Any] = field(default_factory=dict)
    # LoRA (``components.generative.lora.LoraSpec`` fields: r, alpha, dropout, targets) in every tool
    # stage, the code-token rows trainable beside it; empty: the whole LM fine-tunes (the paper).
    lora: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    tool_fields: tuple[str, ...] = TOOL_FIELDS
    document_max_length: int = 96
    query_max_length: int = 48
    trajectory_max_length: int = 160
    agent_replay: float = 1.0
    decoding: str = "constrained"
    num_beams: int = 10
    free_max_new_tokens: int = 4
    eval_batch_size: int = 64
    valid_queries: int | None = None
    agent_valid_queries: int = 300
    perplexity_texts: int = 500
    select_metric: str = "ndcg@3"
    progress: bool = False
    engine: str = "transformers"
    engine_dtype: str = "f32"
    engine_threads: int | None = None
    engine_endpoint: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.stages) - set(self.STAGES))
        if unknown:
            raise ValueError(f"{self.method}: unknown stages {unknown}; stages are {list(self.STAGES)}")
        merged = {}
        for stage in self.STAGES:
            given = dict(self.stages.get(stage) or {})
            bad = sorted(set(given) - self.STAGE_KEYS)
            if bad:
                raise ValueError(
                    f"{self.method}: unknown {stage} settings {bad}; "
                    f"expected some of {sorted(self.STAGE_KEYS)}"
                )
            merged[stage] = {**self.DEFAULT_STAGES[stage], **given}
            cap = merged[stage].get("max_examples")
            if cap is not None and int(cap) < 1:
                # 0 meant "none" in some stages and "all" in the agent stage's trajectories.
                raise ValueError(
                    f"{self.method}: stages.{stage}.max_examples must be >= 1 (or null: all), got {cap}"
                )
        self.stages = merged
        self._check_numbers()
        self.tool_fields = tool_field_names(self.tool_fields, self.method)
        check_select_metric(self.method, self.select_metric)
        if self.lora:
            self.lora_spec()  # a bad adapter setting fails on the driver, not in a worker
        if self.decoding not in ("constrained", "unconstrained"):
            raise ValueError(
                f"{self.method}: decoding must be constrained or unconstrained, got {self.decoding!r}"
            )
        check_engine(self.engine, self.method)
        if self.decoding == "unconstrained" and self.engine == "vllm":
            # Free generation runs on the LM in this process, which engine vllm does not keep:
            # every retrieve would fail.
            raise ValueError(
                f"{self.method}: decoding unconstrained generates in process; engine vllm keeps no LM "
                "here (serve it on transformers, or decode constrained on vllm)"
            )
        if self.engine_dtype not in ("f32", "f16"):
            raise ValueError(f"{self.method}: engine_dtype must be f32 or f16, got {self.engine_dtype!r}")
        check_engine_endpoint(self.engine, self.engine_endpoint, self.method)
        if self.engine_endpoint and self.engine != "vllm":
            # Read by engine vllm only: given to another engine, it was kept and never used.
            raise ValueError(f"{self.method}: engine_endpoint is for engine vllm; engine is {self.engine!r}")

    def _check_numbers(self) -> None:
        """Counts and rates, here on the driver: a stage's batch size of 0 was refused only when
        that stage began (after the stages before it trained), ``epochs: 2.7`` trained 2, and an
        eval batch of 0 or a negative replay failed with a traceback in a worker."""
        for stage, s in self.stages.items():
            whole(f"{self.method}: stages.{stage}.epochs", s["epochs"], 0)  # 0 skips the stage
            if s["epochs"]:
                whole(f"{self.method}: stages.{stage}.batch_size", s["batch_size"], 1)
                if not (is_number(s["lr"]) and s["lr"] > 0):
                    raise ValueError(
                        f"{self.method}: stages.{stage}.lr must be a number > 0, got {s['lr']!r}"
                    )
            if s.get("max_examples") is not None:
                whole(f"{self.method}: stages.{stage}.max_examples", s["max_examples"], 1)
        counts = ("document_max_length", "query_max_length", "trajectory_max_length", "num_beams")
        for key in (*counts, "free_max_new_tokens", "eval_batch_size", "agent_valid_queries"):
            whole(f"{self.method}: {key}", getattr(self, key), 1)
        whole(f"{self.method}: perplexity_texts", self.perplexity_texts, 0)
        for key in ("valid_queries", "engine_threads"):  # null: all queries, llama.cpp's default
            if getattr(self, key) is not None:
                whole(f"{self.method}: {key}", getattr(self, key), 1)
        replay = self.agent_replay
        if not (is_number(replay) and replay >= 0):
            raise ValueError(f"{self.method}: agent_replay must be a number >= 0, got {replay!r}")

    def free_decoding(self, k: int) -> dict[str, int]:
        """``generate_outputs``' settings for ``k`` free beams per prompt, as retrieval and the
        checkpoint ranking of ``decoding: unconstrained`` both decode."""
        return {
            "num_beams": max(self.num_beams, k),
            "max_new_tokens": self.free_max_new_tokens,
            "batch_size": max(1, self.eval_batch_size // 2),
        }

    def lora_spec(self) -> LoraSpec | None:
        """The adapter of the tool stages, or None for full fine-tuning."""
        return lora_spec_from(self.method, self.lora)
