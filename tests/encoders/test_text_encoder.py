"""Tokenizer training, the small-BERT encoder, pooling, and reloading through from_pretrained."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from components.encoders import EncoderSpec, TextEncoder, train_wordpiece
from components.encoders.text_encoder import PAPER_BACKBONES, spec_from

TEXTS = [
    "get the weather forecast for a city",
    "search flights between two airports",
    "find hotels near the airport",
    "recipes using an ingredient like salmon",
] * 5
TINY = EncoderSpec(
    vocab_size=200, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_length=16
)


def test_wordpiece_learns_corpus_words_and_reloads(tmp_path):
    tok = train_wordpiece(TEXTS, vocab_size=200, min_frequency=1)
    assert "forecast" in tok.get_vocab()
    assert tok.tokenize("Weather FORECAST") == ["weather", "forecast"]
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("weather forecast")["input_ids"] == tok("weather forecast")["input_ids"]


@pytest.mark.parametrize("ngram_buckets", [0, 512])  # 512: the hybrid encoder (test_ngram_bag.py)
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_encoder_shapes_and_padding_invariance(pooling, ngram_buckets):
    spec = EncoderSpec(**{**TINY.__dict__, "pooling": pooling, "ngram_buckets": ngram_buckets})
    enc = TextEncoder.from_spec(spec, TEXTS)
    alone = enc.encode(["find hotels"])
    padded = enc.encode(["find hotels", "search flights between two airports near the city"])
    assert alone.shape == (1, 32) and padded.shape == (2, 32)
    torch.testing.assert_close(alone[0], padded[0], atol=1e-5, rtol=1e-4)


def test_a_failed_encode_leaves_a_training_encoder_in_training_mode():
    # encode() runs in eval mode and puts training back; a batch that fails (too long for the
    # position table) must not leave dropout off for the rest of a training run.
    enc = TextEncoder.from_spec(TINY, TEXTS).train()
    with pytest.raises(ValueError, match="exceeds the backbone's"):
        enc.encode(["weather"], max_length=enc.max_positions + 1)
    assert enc.training and all(m.training for m in enc.modules())
    enc.encode(["weather"])
    assert enc.training


@pytest.mark.parametrize("ngram_buckets", [0, 512])
def test_save_load_round_trip_uses_safetensors(tmp_path, ngram_buckets):
    enc = TextEncoder.from_spec(EncoderSpec(**{**TINY.__dict__, "ngram_buckets": ngram_buckets}), TEXTS)
    enc.save(str(tmp_path / "enc"))
    files = os.listdir(tmp_path / "enc")
    assert "model.safetensors" in files and not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)
    # The hybrid's n-gram table has a file of its own; a plain encoder writes none.
    assert ("ngram_bag.safetensors" in files) == bool(ngram_buckets)
    again = TextEncoder.load(str(tmp_path / "enc"))
    torch.testing.assert_close(enc.encode(TEXTS[:4]), again.encode(TEXTS[:4]))
    assert again.pooling == enc.pooling and again.max_length == enc.max_length
    if ngram_buckets:
        assert again.ngrams is not None and again.ngrams.buckets == 512 and again.ngrams.order == 3
    else:
        assert again.ngrams is None


def test_reload_builds_no_pooler_to_fill_with_random_weights(tmp_path, capfd, caplog):
    # save() writes no pooler; a reload that built one would report it as newly initialised.
    TextEncoder.from_spec(TINY, TEXTS).save(str(tmp_path / "enc"))
    capfd.readouterr()
    again = TextEncoder.load(str(tmp_path / "enc"))
    out, err = capfd.readouterr()
    assert "MISSING" not in out + err + caplog.text
    assert again.backbone.pooler is None


def test_name_or_path_loads_any_hf_checkpoint(tmp_path):
    tok = train_wordpiece(TEXTS, vocab_size=200, min_frequency=1)
    model = BertModel(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=48,
        )
    )
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    enc = TextEncoder.from_spec(EncoderSpec(name_or_path=str(tmp_path / "hf"), pooling="cls"))
    assert enc.dim == 24 and enc.encode(["weather"]).shape == (1, 24)
    assert spec_from(str(tmp_path / "hf")).name_or_path == str(tmp_path / "hf")  # a bare path works too
    # Longer inputs than the position table would fail mid-batch with an index error.
    with pytest.raises(ValueError, match="exceeds the backbone's"):
        enc.tokenize(["weather"], max_length=enc.max_positions + 1)
    # Asked for in the spec, it is refused when the encoder is built: training's collate calls the
    # tokenizer itself, so the refusal came only at the first validation, after an epoch.
    with pytest.raises(ValueError, match="exceeds the backbone's"):
        TextEncoder.from_spec(
            EncoderSpec(name_or_path=str(tmp_path / "hf"), max_length=enc.max_positions + 1)
        )


def test_max_positions_knows_roberta_offsets_and_scratch_sizes():
    from transformers import RobertaConfig, RobertaModel

    tok = train_wordpiece(["weather in paris", "flights to rome"] * 10, vocab_size=60)
    tok.model_max_length = int(1e30)  # the "no limit" sentinel many hub tokenizers carry
    config = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=514,
        pad_token_id=1,
    )
    assert TextEncoder(RobertaModel(config), tok).max_positions == 512
    # A small BERT built here for 1,024 tokens takes 1,024 (its tokenizer says so too).
    long = TextEncoder.from_spec(
        EncoderSpec(
            max_length=1024, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, vocab_size=80
        ),
        ["a b c d"] * 20,
    )
    assert long.max_positions == 1024 and long.tokenize(["a b"], max_length=1024)["input_ids"].shape[0] == 1


def test_paper_backbones_resolve_to_hub_names_and_pooling():
    spec = EncoderSpec(name_or_path="tas-b")
    assert spec.name_or_path == PAPER_BACKBONES["tas-b"]["name_or_path"] and spec.pooling == "cls"
    assert EncoderSpec(name_or_path="contriever").pooling == "mean"
    assert EncoderSpec(name_or_path="contriever", pooling="cls").pooling == "cls"  # the user's choice wins
    assert EncoderSpec().pooling == "mean"


def test_bad_specs_are_clear_errors():
    with pytest.raises(ValueError, match="unknown encoder settings"):
        spec_from({"hiden_size": 3})
    with pytest.raises(ValueError, match="pooling"):
        EncoderSpec(pooling="max")
