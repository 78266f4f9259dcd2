"""A tiny causal LM with a few tool tokens, shared by the generative tests (random weights, seeded)."""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM

from components.generative.lm import LMSpec, build_causal_lm
from components.generative.tool_tokens import add_tool_tokens

TEXTS = [
    "what is the weather forecast in paris",
    "find cheap flights to rome",
    "book a hotel near the airport in berlin",
    "dinner recipes with salmon and rice",
] * 10
NAMES = {
    "0": "Sky / forecast",
    "1": "Fly / search flights",
    "2": "Stay / hotel search",
    "3": "Chef / recipes",
}
SPEC = LMSpec(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_length=64)


def tiny_lm(seed: int = 0, tools: bool = True, tied: bool = True, attention_bias: bool = False):
    """(lm, tokenizer, codebook); ``tools=False`` leaves the vocabulary without tool tokens;
    ``attention_bias`` gives the attention projections biases (as Qwen2-style LMs have)."""
    lm, tokenizer = build_causal_lm(SPEC, TEXTS, seed=seed)
    if not tied or attention_bias:  # the same sizes with a separate output projection (as Llama-3-8B has)
        config = lm.config
        config.tie_word_embeddings = tied
        config.attention_bias = attention_bias
        torch.manual_seed(seed)
        lm = LlamaForCausalLM(config)
    codebook = add_tool_tokens(lm, tokenizer, NAMES) if tools else None
    lm.eval()
    return lm, tokenizer, codebook
