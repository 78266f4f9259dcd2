"""Perplexity of plain text under a causal LM (does adding tool tokens hurt the language model?).

ToolGen (arXiv 2410.03439) checks that virtualised tool tokens leave the LM's general abilities
intact; the cheap proxy here is the perplexity of held-out query text, measured with the full
softmax (tool tokens included once they exist, so their probability mass counts against the text).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from components.generative.targeted import LMExample, collate_examples


@torch.no_grad()
def perplexity(
    lm: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    max_length: int = 128,
    batch_size: int = 32,
) -> float:
    """``exp`` of the mean next-token negative log-likelihood over every token of ``texts``.

    Each text is tokenized as the tokenizer does by default (BOS included when it has one); the
    first token is context only.
    """
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    total, count = summed_nll(lm, tokenizer, encoded, batch_size)
    return math.exp(total / count) if count else float("nan")


@torch.no_grad()
def summed_nll(
    lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sequences: Sequence[list[int]], batch_size: int
) -> tuple[float, int]:
    """Summed next-token negative log-likelihood over every token of ``sequences`` but each one's
    first (context only), and the number of tokens scored."""
    lm.eval()
    device = next(lm.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    usable = [ids for ids in sequences if len(ids) > 1]
    total, count = 0.0, 0
    for start in range(0, len(usable), batch_size):
        batch = collate_examples(
            [LMExample.language_model(ids) for ids in usable[start : start + batch_size]], pad
        )
        logits = lm(
            input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)
        ).logits
        picked = logits[batch["rows"].to(device), batch["positions"].to(device)].float()
        total += float(F.cross_entropy(picked, batch["tokens"].to(device), reduction="sum"))
        count += len(batch["tokens"])
    return total, count


@torch.no_grad()
def document_perplexity(
    lm: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    window: int = 512,
    batch_size: int = 8,
) -> tuple[float, int]:
    """Perplexity of one long text (e.g. a book) and the number of tokens it was scored on.

    The text is tokenized once (no special tokens) and cut into consecutive windows of ``window``
    tokens; each window's first token is context only, as in :func:`perplexity`. A general-English
    text measures what tool training costs the LM's language modelling (ToolGen vs ToolWeaver on
    WikiText-2 in arXiv 2601.21947), which query text from the tool corpus cannot.
    """
    if window < 2:
        raise ValueError(f"document_perplexity: window must be >= 2 tokens, got {window}")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    total, count = summed_nll(
        lm, tokenizer, [ids[i : i + window] for i in range(0, len(ids), window)], batch_size
    )
    return (math.exp(total / count) if count else float("nan")), count
