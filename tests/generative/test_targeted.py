"""Loss and logits at chosen positions match the plain causal-LM computation; perplexity is exp(loss)."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_lm import tiny_lm

from components.generative.perplexity import document_perplexity, perplexity
from components.generative.targeted import (
    LMExample,
    TargetedLM,
    collate_examples,
    last_logprobs,
    targets_loss,
)


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(seed=2)


def test_language_model_targets_give_the_hf_loss(lm):
    model, tokenizer, _ = lm
    ids = tokenizer("find cheap flights to rome")["input_ids"]
    batch = collate_examples([LMExample.language_model(ids)], tokenizer.pad_token_id)
    expected = model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss
    torch.testing.assert_close(targets_loss(TargetedLM(model), batch), expected)


def test_continuation_targets_only_the_output_and_padding_changes_nothing(lm):
    model, tokenizer, codebook = lm
    prompt = tokenizer("weather in paris")["input_ids"]
    example = LMExample.continuation(prompt, [*codebook.codes["0"], tokenizer.eos_token_id])
    assert example.targets == [
        (len(prompt) - 1, codebook.codes["0"][0]),
        (len(prompt), tokenizer.eos_token_id),
    ]
    longer = LMExample.language_model(
        tokenizer("book a hotel near the airport in berlin please")["input_ids"]
    )
    alone = targets_loss(TargetedLM(model), collate_examples([example], tokenizer.pad_token_id))
    batch = collate_examples(
        [example, LMExample(longer.ids)], tokenizer.pad_token_id
    )  # padded row, no targets
    assert batch["input_ids"].shape[1] == len(longer.ids) and batch["rows"].tolist() == [0, 0]
    torch.testing.assert_close(targets_loss(TargetedLM(model), batch), alone)


def test_last_logprobs_match_full_forward(lm):
    model, tokenizer, _ = lm
    seqs = [tokenizer(t)["input_ids"] for t in ("a hotel", "dinner recipes with salmon and rice")]
    got = last_logprobs(TargetedLM(model), seqs, tokenizer.pad_token_id, batch_size=2)
    for row, seq in enumerate(seqs):
        full = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0, -1], -1)
        torch.testing.assert_close(got[row], full, atol=1e-5, rtol=1e-5)


def test_perplexity_is_exp_of_the_mean_token_loss(lm):
    model, tokenizer, _ = lm
    texts = ["find cheap flights to rome", "a hotel", "dinner recipes with salmon and rice tonight"]
    total, count = 0.0, 0
    for text in texts:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.no_grad():
            total += float(model(input_ids=ids, labels=ids).loss) * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    assert perplexity(model, tokenizer, texts, batch_size=2) == pytest.approx(
        math.exp(total / count), rel=1e-4
    )


def test_document_perplexity_scores_every_window_of_a_long_text(lm):
    model, tokenizer, _ = lm
    text = " ".join(["find cheap flights to rome and a hotel near the station"] * 6)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    window = 16
    total, count = 0.0, 0
    for i in range(0, len(ids), window):
        chunk = torch.tensor([ids[i : i + window]])
        if chunk.shape[1] < 2:
            continue
        with torch.no_grad():
            total += float(model(input_ids=chunk, labels=chunk).loss) * (chunk.shape[1] - 1)
        count += chunk.shape[1] - 1
    got, scored = document_perplexity(model, tokenizer, text, window=window, batch_size=3)
    assert scored == count and got == pytest.approx(math.exp(total / count), rel=1e-4)
    with pytest.raises(ValueError, match="window must be >= 2"):
        document_perplexity(model, tokenizer, text, window=1)
