"""A causal LM trained and scored only at chosen positions (supervised fine-tuning targets).

ToolGen's stages (arXiv 2410.03439, Sec. 3.2) are supervised fine-tuning: the loss covers the
output (a tool token, an agent's thought/action/arguments), not the prompt. Projecting only those
positions onto the vocabulary skips most of the LM-head cost, which dominates a small LM with a big
vocabulary. A position may carry several targets: a query that needs three tools is one sequence
with three targets at its tool position, the same objective as three (query, tool) pairs with one
forward pass instead of three.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel


@dataclass
class LMExample:
    """One training sequence.

    Attributes:
        ids: Token ids (BOS included when the tokenizer has one).
        targets: ``(position, token)`` pairs: the hidden state at ``position`` must predict ``token``
            (the ordinary next-token target is ``(p, ids[p + 1])``). Repeated positions are allowed.
        weight: Weight of each of this example's targets in the batch's weighted mean loss (e.g. to
            balance a few-target objective against many-target ones in one mixed stage).
    """

    ids: list[int]
    targets: list[tuple[int, int]] = field(default_factory=list)
    weight: float = 1.0

    @classmethod
    def continuation(cls, prompt: Sequence[int], output: Sequence[int]) -> LMExample:
        """``prompt + output`` with a next-token target on every output token (SFT on the output)."""
        ids = [*prompt, *output]
        return cls(ids, [(len(prompt) + i - 1, int(t)) for i, t in enumerate(output)])

    @classmethod
    def language_model(cls, ids: Sequence[int]) -> LMExample:
        """Plain language modelling: every token after the first is a target."""
        return cls(list(ids), [(i, int(ids[i + 1])) for i in range(len(ids) - 1)])


def collate_examples(examples: Sequence[LMExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ids and mask, plus flat (row, position, token, weight) targets.

    Right padding keeps every real token at its true position (no position-id bookkeeping), and a
    causal mask never lets a real token see the padding that follows it.
    """
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    rows, positions, tokens, weights = [], [], [], []
    for r, e in enumerate(examples):
        ids[r, : len(e.ids)] = torch.tensor(e.ids, dtype=torch.long)
        mask[r, : len(e.ids)] = 1
        for p, t in e.targets:
            rows.append(r)
            positions.append(p)
            tokens.append(t)
            weights.append(e.weight)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "rows": torch.tensor(rows, dtype=torch.long),
        "positions": torch.tensor(positions, dtype=torch.long),
        "tokens": torch.tensor(tokens, dtype=torch.long),
        "weights": torch.tensor(weights, dtype=torch.float),
    }


class TargetedLM(nn.Module):
    """Wraps a Hugging Face causal LM; ``forward`` returns logits at the requested positions only.

    One ``forward`` call computes everything a loss needs, so DDP sees every used parameter. The LM
    head is ``get_output_embeddings()``, which holds for Llama, Qwen2, Mistral and GPT-style models
    (not for models that post-process logits, e.g. Gemma-2's soft-capping).
    """

    def __init__(self, lm: PreTrainedModel) -> None:
        super().__init__()
        self.lm = lm

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        rows: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """``(N, vocab)`` logits at ``(rows[i], positions[i])``."""
        # The transformer without its LM head (``get_decoder`` also reaches through a peft adapter,
        # whose ``base_model`` is the adapter wrapper, not the transformer).
        hidden = self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.lm.get_output_embeddings()(hidden[rows, positions])


def targets_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Weighted mean cross-entropy over every target of the batch (``model`` is a :class:`TargetedLM`).

    With unit weights this is the plain mean, i.e. the usual SFT loss over output tokens.
    """
    logits = model(batch["input_ids"], batch["attention_mask"], batch["rows"], batch["positions"])
    losses = F.cross_entropy(logits.float(), batch["tokens"], reduction="none")
    return (losses * batch["weights"]).sum() / batch["weights"].sum().clamp_min(1e-12)


@runtime_checkable
class NextTokenScorer(Protocol):
    """Another engine's next-token distribution (llama.cpp's
    :class:`components.generative.llamacpp.LlamaCppScorer`, vLLM's
    :class:`components.generative.vllm_scorer.VLLMScorer`), usable wherever a :class:`TargetedLM`
    is scored for decoding."""

    def next_logprobs(
        self, sequences: Sequence[Sequence[int]], wanted: Sequence[Sequence[int]] | None = None
    ) -> torch.Tensor:
        """Log-probabilities (full softmax) of the token after each sequence, one row each. ``wanted``
        names, per sequence, the tokens the caller reads: an engine may fill in only those (vLLM
        returns named tokens only; the row is ``-inf`` elsewhere); llama.cpp fills in every token."""
        ...


@torch.no_grad()
def last_logprobs(
    model: TargetedLM | NextTokenScorer,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    batch_size: int = 64,
    wanted: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """``(len(sequences), vocab)`` next-token log-probabilities after each sequence (full softmax);
    an engine's scorer may fill in only the ``wanted`` tokens of each (see :class:`NextTokenScorer`)."""
    if isinstance(model, NextTokenScorer):
        return model.next_logprobs(sequences, wanted)
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(sequences), batch_size):
        chunk = sequences[i : i + batch_size]
        examples = [LMExample(list(s)) for s in chunk]
        batch = collate_examples(examples, pad_id)
        rows = torch.arange(len(chunk), device=device)
        last = torch.tensor([len(s) - 1 for s in chunk], device=device)
        logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device), rows, last)
        out.append(torch.log_softmax(logits.float(), dim=-1).cpu())
    return torch.cat(out) if out else torch.zeros(0, 0)
