"""A causal LM saved together with its tokenizer and tool codebook (one generative stage's output).

The LM and tokenizer use the Hugging Face layout (config + safetensors + tokenizer files), so a
stage output loads with ``from_pretrained`` anywhere; ``codebook.json`` maps tool ids to their
token-id codes in that tokenizer. A path without a codebook (a hub name, or a warm-up output from
before tool virtualisation) loads with an empty codebook.
"""

from __future__ import annotations

import json
import os

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from components.generative.lm import load_causal_lm, load_tokenizer, save_causal_lm
from components.generative.tool_tokens import ToolCodebook

CODEBOOK = "codebook.json"


def save_bundle(
    lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, codebook: ToolCodebook, path: str
) -> None:
    """Write the LM and tokenizer (HF layout) and ``codebook.json`` to ``path``."""
    os.makedirs(path, exist_ok=True)
    save_causal_lm(lm, tokenizer, path)
    save_codebook(codebook, path)


def save_codebook(codebook: ToolCodebook, path: str) -> None:
    """Write ``codebook.json`` into the bundle at ``path`` (e.g. codes given without a new token)."""
    with open(os.path.join(path, CODEBOOK), "w") as f:
        json.dump(codebook.to_json(), f)


def load_codes(name_or_path: str) -> tuple[PreTrainedTokenizerBase, ToolCodebook]:
    """The tokenizer and codebook of a bundle without its weights (a decoder whose LM is served
    elsewhere, e.g. by vLLM, needs only these)."""
    tokenizer = load_tokenizer(name_or_path)
    return tokenizer, _codebook(name_or_path)


def _codebook(name_or_path: str) -> ToolCodebook:
    file = os.path.join(name_or_path, CODEBOOK)
    codes = {}
    if os.path.exists(file):
        with open(file) as f:
            codes = json.load(f)
    return ToolCodebook.from_json(codes)


def load_bundle(
    name_or_path: str, dtype: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, ToolCodebook]:
    """Inverse of :func:`save_bundle`; also accepts a hub name or a plain HF directory."""
    lm, tokenizer = load_causal_lm(name_or_path, dtype)
    return lm, tokenizer, _codebook(name_or_path)
