"""The hashed token n-gram bag (fastText's channel) and the hybrid encoder built with it.

The hybrid's padding invariance and save/load round trip are parametrized cases of
``test_text_encoder.py``'s tests.
"""

from __future__ import annotations

import pytest
import torch
from test_text_encoder import TEXTS, TINY

from components.encoders import EncoderSpec, TextEncoder
from components.encoders.ngram_bag import TokenNgramBag, hash_ngrams

HYBRID = EncoderSpec(**{**TINY.__dict__, "ngram_buckets": 512})


@pytest.mark.parametrize("order", [1, 2, 3, 5])
@pytest.mark.parametrize("length", [1, 2, 4, 9])
def test_hash_shapes_ranges_and_counts(order, length):
    ids = torch.randint(0, 1000, (3, length))
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, length // 2 :] = 0  # a padded row
    buckets, real = hash_ngrams(ids, mask, buckets=97, order=order)
    expected = sum(max(length - n + 1, 0) for n in range(1, order + 1))
    # Every order takes every start position (a shape that does not depend on the length, for an
    # ONNX export); those running past the text are not real.
    assert buckets.shape == real.shape == (3, order * length)
    assert int(buckets.min()) >= 0 and int(buckets.max()) < 97
    # Row 0 is all real; row 1 keeps only n-grams inside its unpadded prefix.
    kept = length // 2
    assert int(real[0].sum()) == expected
    assert int(real[1].sum()) == sum(max(kept - n + 1, 0) for n in range(1, order + 1))


def test_ngrams_are_order_sensitive_and_deterministic():
    ab, ba = torch.tensor([[5, 9]]), torch.tensor([[9, 5]])
    mask = torch.ones(1, 2, dtype=torch.long)
    h_ab, _ = hash_ngrams(ab, mask, buckets=1 << 20, order=2)
    h_ba, _ = hash_ngrams(ba, mask, buckets=1 << 20, order=2)
    assert sorted(h_ab[0, :2].tolist()) == sorted(h_ba[0, :2].tolist())  # same unigrams
    assert h_ab[0, 2] != h_ba[0, 2]  # different bigram
    torch.testing.assert_close(hash_ngrams(ab, mask, 1 << 20, 2)[0], h_ab)


def test_bag_ignores_padding():
    bag = TokenNgramBag(buckets=64, dim=8, order=3)
    ids = torch.tensor([[2, 7, 8, 3]])
    short = bag(ids, torch.ones_like(ids))
    padded_ids = torch.tensor([[2, 7, 8, 3, 0, 0, 0]])
    padded = bag(padded_ids, torch.tensor([[1, 1, 1, 1, 0, 0, 0]]))
    torch.testing.assert_close(short, padded)


@pytest.mark.parametrize(("order", "separable"), [(1, False), (2, True)])
def test_bigrams_learn_what_a_bag_of_words_cannot(order, separable):
    # "dog bites man" vs "man bites dog": same words, other order. Only bigrams tell them apart.
    x = torch.tensor([[1, 2, 3], [3, 2, 1]])
    y = torch.tensor([0, 1])
    torch.manual_seed(0)
    bag = TokenNgramBag(buckets=4096, dim=8, order=order)
    head = torch.nn.Linear(8, 2)
    opt = torch.optim.Adam([*bag.parameters(), *head.parameters()], lr=0.05)
    for _ in range(200):
        loss = torch.nn.functional.cross_entropy(head(bag(x, torch.ones_like(x))), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert (loss.item() < 0.05) is separable


def test_bad_bag_settings_are_clear_errors():
    with pytest.raises(ValueError, match="buckets >= 1"):
        TokenNgramBag(buckets=0, dim=4)
    with pytest.raises(ValueError, match="ngram_buckets"):
        EncoderSpec(ngram_buckets=-1)
    with pytest.raises(ValueError, match="ngram_order"):
        EncoderSpec(ngram_order=0)


def test_hybrid_encoder_sums_two_normalised_channels():
    enc = TextEncoder.from_spec(HYBRID, TEXTS).eval()
    tokens = enc.tokenize(["find hotels near the airport"])
    with torch.no_grad():
        out = enc(tokens["input_ids"], tokens["attention_mask"])
        bag = enc.ngrams(tokens["input_ids"], tokens["attention_mask"])
        enc.ngrams, ngrams = None, enc.ngrams
        pooled = enc(tokens["input_ids"], tokens["attention_mask"])
    enc.ngrams = ngrams
    expected = torch.nn.functional.normalize(pooled, dim=-1) + torch.nn.functional.normalize(bag, dim=-1)
    torch.testing.assert_close(out, expected)
    assert enc.dim == 32
