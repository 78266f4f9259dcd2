"""Write a Hugging Face Llama-architecture causal LM as a GGUF file that llama.cpp runs.

ToolGen and ToolWeaver fine-tune an LM and add tool or code tokens to it; to decode with llama.cpp
on CPU (:class:`components.generative.llamacpp.LlamaCppScorer`) the trained weights and the grown
vocabulary must be in llama.cpp's format. This writer covers the architecture the methods train
here: ``LlamaForCausalLM`` (the scratch LM and SmolLM2), with a LoRA adapter merged first.

Two things differ from the Hugging Face layout:

- **Rotary layout**: Hugging Face's Llama rotates the two halves of each head's query/key vector
  (``rotate_half``); llama.cpp's kernel rotates interleaved pairs. The q/k projection rows are
  therefore permuted per head so that both compute the same attention (the logits are checked
  against transformers in the tests).
- **Vocabulary**: every token id of the embedding matrix gets an entry (the tokenizer's tokens,
  special and added tokens as control / user-defined, padding rows as unused), so the ids that
  :mod:`components.generative.tool_tokens` added mean the same in both engines. Prompts are
  tokenized by the method's own tokenizer and handed to llama.cpp as ids.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES = ("f32", "f16")


def merged(lm: PreTrainedModel) -> PreTrainedModel:
    """``lm`` with a peft LoRA adapter merged into its weights (a copy), else ``lm`` itself."""
    if hasattr(lm, "merge_and_unload"):
        import copy

        return copy.deepcopy(lm).merge_and_unload()
    return lm


def rotary_permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder a q/k projection's output rows per head from halves to interleaved pairs (see module)."""
    per_half = weight.shape[0] // n_heads // 2
    split = weight.reshape(n_heads, 2, per_half, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def vocabulary(tokenizer: PreTrainedTokenizerBase, size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) for the GGUF: one entry per embedding row."""
    import gguf

    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    special = set(tokenizer.all_special_ids)
    added = set(tokenizer.get_added_vocab().values())
    tokens, types = [], []
    for i in range(size):
        if i not in by_id:  # an embedding row no token uses (resize_token_embeddings padding)
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[i])
        if i in special:
            types.append(gguf.TokenType.CONTROL)
        elif i in added:
            types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"GGUF export: only BPE tokenizers are written, got {model.get('type')!r}")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def export_gguf(
    lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str, dtype: str = "f32"
) -> str:
    """Write ``lm`` (+ its tokenizer) to ``path`` as GGUF; returns ``path``.

    Args:
        lm: A ``LlamaForCausalLM`` (or a peft model around one; the adapter is merged).
        tokenizer: Its fast BPE tokenizer, tool tokens included.
        path: The ``.gguf`` file to write (its directory is created).
        dtype: ``f32`` (exact up to kernel rounding) or ``f16`` (half the size; matrices only,
            norms stay f32 as llama.cpp expects).

    Raises:
        ValueError: another architecture, a non-BPE tokenizer, or an unknown ``dtype``.
    """
    import gguf

    if dtype not in DTYPES:
        raise ValueError(f"GGUF export: dtype must be one of {DTYPES}, got {dtype!r}")
    lm = merged(lm)
    cfg = lm.config
    if cfg.model_type != "llama":
        raise ValueError(f"GGUF export: only Llama-architecture LMs are written, got {cfg.model_type!r}")
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"GGUF export: rope scaling {rope_type!r} is not written; plain RoPE only")
    theta = rope.get("rope_theta") or getattr(cfg, "rope_theta", 10000.0)
    embeddings = lm.get_input_embeddings().weight
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(getattr(cfg, "_name_or_path", "") or "toolscout-lm")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_rope_dimension_count(head_dim)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float(theta))
    writer.add_vocab_size(embeddings.shape[0])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    tokens, types, merges = vocabulary(tokenizer, embeddings.shape[0])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (
        ("bos_token_id", writer.add_bos_token_id),
        ("eos_token_id", writer.add_eos_token_id),
        ("pad_token_id", writer.add_pad_token_id),
    ):
        if getattr(tokenizer, key) is not None:
            add(int(getattr(tokenizer, key)))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    for name, tensor in lm.state_dict().items():
        if name == "lm_head.weight" and tied:
            continue  # llama.cpp reuses token_embd when the file has no output matrix
        if name.endswith("rotary_emb.inv_freq"):
            continue
        data = tensor.detach().to(torch.float32).cpu().numpy()
        # A bias follows its rows (an LM with attention_bias): left in halves order, every
        # head's rotary pairs got the wrong biases.
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            data = rotary_permute(data, heads)
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            data = rotary_permute(data, kv_heads)
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"GGUF export: no llama.cpp name for tensor {name!r}")
        if dtype == "f16" and data.ndim == 2:
            data = data.astype(np.float16)
        writer.add_tensor(target, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
