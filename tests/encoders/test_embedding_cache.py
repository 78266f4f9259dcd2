"""The disk cache of a frozen encoder's embeddings (components/encoders/embedding_cache.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from components.encoders import EncoderSpec, TextEncoder
from components.encoders.embedding_cache import EmbeddingCache

TEXTS = ["get the weather forecast for a city", "search flights between two airports", "find hotels"]
SPEC = EncoderSpec(
    vocab_size=200, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_length=16
)


def frozen(shift: float) -> TextEncoder:
    enc = TextEncoder.from_spec(SPEC, TEXTS).requires_grad_(False)
    with torch.no_grad():  # another encoder: every weight moved (shift 0: the encoder as built)
        for p in enc.parameters():
            p.add_(shift)
    return enc


def test_a_second_call_reads_what_the_first_wrote_without_running_the_encoder(tmp_path, monkeypatch):
    enc = frozen(0)
    first = EmbeddingCache(str(tmp_path), enc).encode(TEXTS, 8)
    torch.testing.assert_close(first, enc.encode(TEXTS, max_length=8), atol=0, rtol=0)

    reopened = EmbeddingCache(str(tmp_path), enc)  # as a later epoch or Tune trial would
    monkeypatch.setattr(enc, "encode", lambda *a, **k: pytest.fail("the encoder ran on a cached call"))
    again = reopened.encode(TEXTS, 8)
    assert (reopened.hits, reopened.misses) == (1, 0)
    assert torch.equal(again, first)


def test_other_texts_lengths_or_weights_are_other_entries(tmp_path):
    cache = EmbeddingCache(str(tmp_path), frozen(0))
    cache.encode(TEXTS, 8)
    cache.encode(TEXTS, 12)  # cut at another length
    cache.encode(["search flights", "between two airports"], 8)
    cache.encode(["search flightsbetween", " two airports"], 8)  # same characters, other texts
    assert (cache.hits, cache.misses) == (0, 4)

    other = EmbeddingCache(str(tmp_path), frozen(0.01))  # different weights: a directory of its own
    assert other.dir != cache.dir
    assert not torch.equal(other.encode(TEXTS, 8), cache.encode(TEXTS, 8))
    assert other.misses == 1
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(cache.dir), os.path.basename(other.dir)])


def test_the_encoders_own_length_keys_a_call_that_names_none(tmp_path):
    # MassTool embeds its queries with max_length None: the encoder's own length cuts them, and a
    # sweep over it (two encoders with equal weights) must not read the other trial's vectors.
    enc = frozen(0)
    short = TextEncoder(enc.backbone, enc.tokenizer, enc.pooling, 4, enc.ngrams)
    full = EmbeddingCache(str(tmp_path), enc).encode(TEXTS)
    cut = EmbeddingCache(str(tmp_path), short).encode(TEXTS)
    torch.testing.assert_close(cut, short.encode(TEXTS), atol=0, rtol=0)
    assert not torch.equal(cut, full)


def test_an_encoder_that_trains_cannot_use_a_cache(tmp_path):
    enc = TextEncoder.from_spec(SPEC, TEXTS)
    with pytest.raises(ValueError, match="frozen encoder"):
        EmbeddingCache(str(tmp_path), enc)
    cache = EmbeddingCache(str(tmp_path), enc.requires_grad_(False))
    enc.requires_grad_(True)
    with pytest.raises(RuntimeError, match="unfrozen"):
        cache.encode(TEXTS)


def test_weights_changed_in_place_after_opening_are_keyed_anew(tmp_path):
    # A cache opened before a checkpoint's weights are loaded into the same modules (or any other
    # in-place change) must not serve the vectors of the weights it was opened with.
    enc = frozen(0)
    cache = EmbeddingCache(str(tmp_path), enc)
    before = cache.encode(TEXTS, 8)
    with torch.no_grad():
        enc.load_state_dict(frozen(0.01).state_dict())
    after = cache.encode(TEXTS, 8)
    torch.testing.assert_close(after, enc.encode(TEXTS, max_length=8), atol=0, rtol=0)
    assert not torch.equal(after, before) and cache.misses == 2
    assert cache.dir == EmbeddingCache(str(tmp_path), enc).dir  # the directory of the new weights


def test_a_tokenizer_of_the_same_size_with_another_vocabulary_is_another_encoder(tmp_path):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    enc = frozen(0)
    definition = json.loads(enc.tokenizer.backend_tokenizer.to_str())
    vocab = definition["model"]["vocab"]
    a, b = [t for t in sorted(vocab) if not t.startswith(("[", "#"))][:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two tokens swap ids: same size, other splits' ids
    swapped = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(definition)),
        **{
            k: getattr(enc.tokenizer, k)
            for k in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
        },
    )
    assert len(swapped) == len(enc.tokenizer)
    other = TextEncoder(enc.backbone, swapped, enc.pooling, enc.max_length, enc.ngrams)
    assert EmbeddingCache(str(tmp_path), other).dir != EmbeddingCache(str(tmp_path), enc).dir


def test_the_side_padding_goes_on_is_part_of_the_key(tmp_path):
    # A BERT's absolute positions move with left padding: other vectors for a batch of texts.
    enc = frozen(0)
    right = EmbeddingCache(str(tmp_path), enc).dir
    enc.tokenizer.padding_side = "left"
    assert EmbeddingCache(str(tmp_path), enc).dir != right


def test_the_side_long_texts_are_cut_on_is_part_of_the_key(tmp_path):
    # A text longer than max_length keeps its start or its end: other tokens, other vectors.
    enc = frozen(0)
    right = EmbeddingCache(str(tmp_path), enc).dir
    enc.tokenizer.truncation_side = "left"
    assert EmbeddingCache(str(tmp_path), enc).dir != right


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    cache = EmbeddingCache(str(tmp_path), frozen(0))

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "save", disk_full)
    with pytest.raises(OSError):
        cache.encode(TEXTS[:2])
    assert os.listdir(cache.dir) == []
