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
    lm.eval()
    device = next(lm.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    total, count = 0.0, 0
    for start in range(0, len(texts), batch_size):
        encoded = tokenizer(list(texts[start : start + batch_size]), truncation=True, max_length=max_length)
        examples = [LMExample.language_model(ids) for ids in encoded["input_ids"] if len(ids) > 1]
        if not examples:
            continue
        batch = collate_examples(examples, pad)
        logits = lm(
            input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)
        ).logits
        picked = logits[batch["rows"].to(device), batch["positions"].to(device)].float()
        total += float(F.cross_entropy(picked, batch["tokens"].to(device), reduction="sum"))
        count += len(batch["tokens"])
    return math.exp(total / count) if count else float("nan")
