"""ToolGen / ToolWeaver decoding on llama.cpp: a trained LM exported to GGUF scores as transformers
does, and the trie-constrained search on it returns the same catalog tools (and only those)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_lm import NAMES, tiny_lm

from components.generative.constrained import constrained_top_k
from components.generative.gguf_export import export_gguf
from components.generative.llamacpp import LlamaCppScorer
from components.generative.targeted import TargetedLM, last_logprobs
from components.generative.tool_tokens import ToolCodebook

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the pretrained extra) is not installed")


def trained_like(seed: int, tied: bool = True, attention_bias: bool = False):
    """The tiny LM with tool tokens, its weights moved off their initialisation (a trained LM's
    rows are not the small-normal init that could hide a wrong layout)."""
    lm, tokenizer, codebook = tiny_lm(seed=seed, tied=tied, attention_bias=attention_bias)
    torch.manual_seed(seed + 100)
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return lm, tokenizer, codebook


def prompts_of(tokenizer):
    texts = ["weather in paris", "flights to rome please", "a hotel", "salmon dinner with rice tonight"]
    return [tokenizer(t)["input_ids"] for t in texts]


# Attention biases: the q/k biases are rotary-permuted as their rows are (written as they were,
# llama.cpp's log-probabilities differed from transformers' by about 1).
@pytest.mark.parametrize("tied, attention_bias", [(True, False), (False, False), (True, True)])
def test_exported_lm_gives_transformers_logprobs(tmp_path, tied, attention_bias):
    lm, tokenizer, _ = trained_like(seed=2, tied=tied, attention_bias=attention_bias)
    scorer = LlamaCppScorer(export_gguf(lm, tokenizer, str(tmp_path / "lm.gguf")), n_ctx=64, n_threads=1)
    prompts = prompts_of(tokenizer)
    # The same sequences twice and a prefix of one: the KV-cache reuse must not change a result.
    sequences = [*prompts, prompts[1][:3], *prompts]
    ours = scorer.next_logprobs(sequences)
    reference = last_logprobs(TargetedLM(lm), sequences, tokenizer.pad_token_id)
    assert ours.shape == reference.shape == (len(sequences), lm.get_input_embeddings().weight.shape[0])
    # llama.cpp keeps its KV cache in f16: agreement to ~1e-3, not to float32 rounding.
    assert torch.allclose(ours, reference, atol=1e-2), float((ours - reference).abs().max())
    # A wrong rotary layout or vocabulary would not survive this: rankings agree too.
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def test_constrained_search_on_llamacpp_returns_the_same_catalog_tools(tmp_path):
    lm, tokenizer, codebook = trained_like(seed=3)
    scorer = LlamaCppScorer(export_gguf(lm, tokenizer, str(tmp_path / "lm.gguf")), n_ctx=64, n_threads=1)
    prompts = prompts_of(tokenizer)
    pad, end = tokenizer.pad_token_id, tokenizer.eos_token_id
    # ToolGen: one token per tool.
    ours = constrained_top_k(scorer, prompts, codebook.trie(), 3, pad)
    reference = constrained_top_k(TargetedLM(lm), prompts, codebook.trie(), 3, pad)
    assert [[t for t, _ in h] for h in ours] == [[t for t, _ in h] for h in reference]
    assert all(t in NAMES for hits in ours for t, _ in hits)
    # ToolWeaver: 2-3 token codes with shared prefixes; a narrowed trie per prompt (candidates).
    codes = {"a": [5, 6], "b": [5, 7], "c": [8, 6, 9], "d": [8, 6, 10], "e": [8, 11]}
    book = ToolCodebook(codes)
    tries = [book.trie(["a", "c", "e"]), book.trie(list(codes)), book.trie(["b"]), book.trie(["c", "d"])]
    ours = constrained_top_k(scorer, prompts, tries, 2, pad, num_beams=4, end_token=end)
    reference = constrained_top_k(TargetedLM(lm), prompts, tries, 2, pad, num_beams=4, end_token=end)
    assert [[t for t, _ in h] for h in ours] == [[t for t, _ in h] for h in reference]
    for hits, ref in zip(ours, reference, strict=True):
        assert [s for _, s in hits] == pytest.approx([s for _, s in ref], abs=5e-3)
    allowed = [{"a", "c", "e"}, set(codes), {"b"}, {"c", "d"}]
    assert all({t for t, _ in h} <= ok for h, ok in zip(ours, allowed, strict=True))


def test_f16_export_is_half_the_size_and_keeps_the_ranking(tmp_path):
    lm, tokenizer, _ = trained_like(seed=4)
    f32 = export_gguf(lm, tokenizer, str(tmp_path / "f32.gguf"))
    f16 = export_gguf(lm, tokenizer, str(tmp_path / "f16.gguf"), dtype="f16")
    assert (tmp_path / "f16.gguf").stat().st_size < 0.7 * (tmp_path / "f32.gguf").stat().st_size
    prompts = prompts_of(tokenizer)
    a = LlamaCppScorer(f32, n_ctx=64, n_threads=1).next_logprobs(prompts)
    b = LlamaCppScorer(f16, n_ctx=64, n_threads=1).next_logprobs(prompts)
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert float((a - b).abs().max()) < 0.05


def test_export_refuses_what_it_cannot_write(tmp_path):
    lm, tokenizer, _ = tiny_lm(seed=0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        export_gguf(lm, tokenizer, str(tmp_path / "x.gguf"), dtype="q4")
    lm.config.model_type = "gpt2"
    with pytest.raises(ValueError, match="only Llama-architecture"):
        export_gguf(lm, tokenizer, str(tmp_path / "x.gguf"))
    with pytest.raises(ValueError, match="n_ctx"):
        LlamaCppScorer(str(tmp_path / "missing.gguf"), n_ctx=4).next_logprobs([[1, 2, 3, 4, 5]])


def test_vocabulary_has_one_entry_per_embedding_row_with_tool_tokens_user_defined(tmp_path):
    import gguf

    lm, tokenizer, codebook = tiny_lm(seed=0)
    lm.resize_token_embeddings(len(tokenizer) + 3)  # padding rows no token uses
    path = export_gguf(lm, tokenizer, str(tmp_path / "lm.gguf"))
    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode() for i in field.data]
    kinds = reader.fields["tokenizer.ggml.token_type"]
    types = [int(kinds.parts[i][0]) for i in kinds.data]
    assert len(tokens) == len(tokenizer) + 3
    for tool, (token_id,) in codebook.codes.items():
        assert tokens[token_id] == tokenizer.convert_ids_to_tokens(token_id)
        assert types[token_id] == gguf.TokenType.USER_DEFINED, tool
    assert types[-1] == gguf.TokenType.UNUSED and types[tokenizer.bos_token_id] == gguf.TokenType.CONTROL
    assert np.all(np.array(types[: len(tokenizer)]) != gguf.TokenType.UNUSED)
