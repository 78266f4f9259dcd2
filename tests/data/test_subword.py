"""Deterministic BPE learning and the tokenizers built from it."""

from __future__ import annotations

import random

from components.data.subword import learn_bpe, merge_pair
from components.encoders import train_wordpiece
from components.generative.lm import train_bpe

TEXTS = [
    "find flights from paris to rome",
    "weather forecast in paris tomorrow",
    "convert 250.5 usd to eur",
    "recipes with salmon and rice",
    "flight status for lh 123",
    "forecast for rome this weekend",
] * 5


def test_merge_pair_is_left_to_right_and_non_overlapping() -> None:
    assert merge_pair(["a", "a", "a"], "a", "a", "aa") == ["aa", "a"]
    assert merge_pair(["a", "b", "a", "b"], "a", "b", "ab") == ["ab", "ab"]
    assert merge_pair(["x", "y"], "a", "b", "ab") == ["x", "y"]


def test_most_frequent_pair_first_and_ties_by_symbol_ids() -> None:
    # ("l", "##o") and ("o", "##l") both occur 5 times, ("a", "##b") 6 times: "ab" first, then the
    # tie goes to the pair of smaller ids ("l" < "o", characters are numbered by code point).
    learned = learn_bpe(["lo"] * 5 + ["ol"] * 5 + ["ab"] * 6, vocab_size=100, prefix="##")
    assert learned.merges == [("a", "##b"), ("l", "##o"), ("o", "##l")]
    assert {"ab", "lo", "ol"} <= set(learned.vocab)


def test_stops_at_min_frequency_and_vocab_size() -> None:
    few = learn_bpe(["ab", "cd"], vocab_size=100, min_frequency=2)
    assert few.merges == []  # every pair occurs once
    capped = learn_bpe(["abcdef"] * 10, vocab_size=8, min_frequency=1)
    assert len(capped.vocab) == 8


def test_same_words_in_any_order_give_identical_vocabulary() -> None:
    words = " ".join(TEXTS).split()
    shuffled = words[:]
    random.Random(1).shuffle(shuffled)
    a = learn_bpe(words, vocab_size=120, min_frequency=1, prefix="##")
    b = learn_bpe(shuffled, vocab_size=120, min_frequency=1, prefix="##")
    assert a.vocab == b.vocab and a.merges == b.merges


def test_wordpiece_and_byte_bpe_tokenizers_are_byte_identical_across_runs() -> None:
    # tokenizers' own trainers break count ties in hash order, so token ids changed per process.
    for train in (train_wordpiece, train_bpe):
        first = train(TEXTS, vocab_size=150, min_frequency=1).backend_tokenizer.to_str()
        second = train(list(reversed(TEXTS)), vocab_size=150, min_frequency=1).backend_tokenizer.to_str()
        assert first == second, train.__name__


def test_wordpiece_keeps_every_character_as_a_word_start() -> None:
    # "x" only occurs mid-word in training; a word starting with it must not become [UNK].
    tok = train_wordpiece(["box fox"] * 3, vocab_size=60, min_frequency=1)
    assert "[UNK]" not in tok.tokenize("xo")


def test_byte_bpe_round_trips_text() -> None:
    tok = train_bpe(TEXTS, vocab_size=400, min_frequency=1)
    text = "Convert 99.5 GBP to ¥ — flights to Zürich"
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True).strip() == text
