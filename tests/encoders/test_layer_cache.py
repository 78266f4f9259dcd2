"""Fine-tuning only the top layers from cached lower-layer states (components/encoders/layer_cache.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from components.encoders import EncoderSpec, TextEncoder
from components.encoders.layer_cache import freeze_lower, lower_states, pad_states, upper_forward

TEXTS = [
    "get the weather forecast for a city",
    "search flights between two airports",
    "find hotels",
    "recipes using an ingredient like salmon and a long tail of words to pad the others",
] * 3
SPEC = EncoderSpec(
    vocab_size=200, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64, max_length=24
)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_top_layers_from_cached_states_equal_the_full_forward(pooling, attention):
    enc = TextEncoder.from_spec(EncoderSpec(**{**SPEC.__dict__, "pooling": pooling}), TEXTS).eval()
    enc.backbone.set_attn_implementation(attention)
    full = enc.encode(TEXTS[:4])
    _check_cached_states(enc, full)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_tokenizer_that_pads_on_the_left_is_cached_and_pooled_from_its_own_tokens(pooling):
    """Some checkpoints' tokenizers pad on the left: the cache keeps each text's attended positions
    (not its first n), and [CLS] pooling reads the first attended position, not the padding."""
    enc = TextEncoder.from_spec(EncoderSpec(**{**SPEC.__dict__, "pooling": pooling}), TEXTS).eval()
    enc.tokenizer.padding_side = "left"
    tokens = enc.tokenize(TEXTS[:4])
    assert tokens["attention_mask"][0, 0] == 0  # the short texts are left-padded
    with torch.no_grad():
        last = enc.backbone(**tokens).last_hidden_state
    first = tokens["attention_mask"].argmax(1)
    assert (tokens["input_ids"][torch.arange(4), first] == enc.tokenizer.cls_token_id).all()
    full = enc.encode(TEXTS[:4])
    if pooling == "cls":
        torch.testing.assert_close(full, last[torch.arange(4), first])
    _check_cached_states(enc, full)


def _check_cached_states(enc: TextEncoder, full: torch.Tensor) -> None:
    for n in range(3):
        states = lower_states(enc, TEXTS[:4], n)
        # Stored without padding: each text keeps only its own tokens.
        assert [len(s) for s in states] == enc.tokenize(TEXTS[:4])["attention_mask"].sum(1).tolist()
        hidden, mask = pad_states(states)
        with torch.no_grad():
            torch.testing.assert_close(upper_forward(enc, hidden, mask, n), full, atol=1e-5, rtol=1e-4)


def test_freezing_stops_gradients_below_the_cut_only():
    enc = TextEncoder.from_spec(SPEC, TEXTS)
    freeze_lower(enc, 2)
    layers = enc.backbone.encoder.layer
    # Frozen for any path through the encoder, not only the cached one (whose lower part runs
    # without a graph, so no gradient could reach it whatever freeze_lower did).
    assert not any(p.requires_grad for p in enc.backbone.embeddings.parameters())
    assert not any(p.requires_grad for layer in layers[:2] for p in layer.parameters())
    assert all(p.requires_grad for p in layers[2].parameters())
    hidden, mask = pad_states(lower_states(enc, TEXTS[:4], 2))
    upper_forward(enc, hidden, mask, 2).sum().backward()
    assert all(p.grad is None for p in enc.backbone.embeddings.parameters())
    assert all(p.grad is None for layer in layers[:2] for p in layer.parameters())
    assert all(p.grad is not None for p in layers[2].parameters())


def test_bad_cuts_and_backbones_are_clear_errors():
    enc = TextEncoder.from_spec(SPEC, TEXTS)
    with pytest.raises(ValueError, match=r"frozen_layers must be in \[0, 2\]"):
        freeze_lower(enc, 3)  # nothing would be left to train
    hybrid = TextEncoder.from_spec(EncoderSpec(**{**SPEC.__dict__, "ngram_buckets": 64}), TEXTS)
    with pytest.raises(ValueError, match="n-gram channel"):
        freeze_lower(hybrid, 1)
    with pytest.raises(ValueError, match=r"BERT-style backbone.*Linear"):
        freeze_lower(TextEncoder(nn.Linear(4, 4), tokenizer=None), 1)
