"""Fine-tune only a text encoder's top layers, from cached outputs of its frozen lower layers.

The CPU profile of a pretrained backbone (MiniLM under dense and MassTool, arXiv 2507.00487's
semantic stage): fine-tuning all six layers of all-MiniLM-L6-v2 on ToolLens costs about an hour per
epoch on 2 cores, most of it re-running layers that a small learning rate barely moves. Freezing the
embeddings and the lowest ``n`` transformer layers makes their output a fixed function of the text,
so it is computed once per training text and kept; each step then runs only the top layers. With
four of six layers frozen a step costs about a third of a full one (forward and backward of two
layers instead of six) and the lower layers' forward is paid once, not once per epoch.

Only BERT-style backbones (``embeddings`` + ``encoder.layer``, e.g. BERT, MiniLM, DistilBERT's
cousins in that layout) are supported; others get a clear error.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import create_bidirectional_mask

from components.encoders.text_encoder import TextEncoder


def transformer_layers(encoder: TextEncoder) -> nn.ModuleList:
    """The backbone's stack of transformer layers (BERT layout), or a ValueError naming the class."""
    stack = getattr(getattr(encoder.backbone, "encoder", None), "layer", None)
    if not isinstance(stack, nn.ModuleList) or not hasattr(encoder.backbone, "embeddings"):
        raise ValueError(
            f"frozen_layers needs a BERT-style backbone (embeddings + encoder.layer); "
            f"{type(encoder.backbone).__name__} is not one"
        )
    return stack


def freeze_lower(encoder: TextEncoder, n: int) -> None:
    """Stop gradients into the embeddings and the lowest ``n`` layers (``n`` = 0: nothing frozen)."""
    layers = transformer_layers(encoder)
    if not 0 <= n < len(layers):
        raise ValueError(f"frozen_layers must be in [0, {len(layers) - 1}] for this backbone, got {n}")
    if n == 0:
        return
    if encoder.ngrams is not None:
        raise ValueError("frozen_layers does not support the n-gram channel (it reads token ids)")
    encoder.backbone.embeddings.requires_grad_(False)
    for layer in layers[:n]:
        layer.requires_grad_(False)


def run_layers(
    encoder: TextEncoder, layers: nn.ModuleList, hidden: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """``hidden`` through ``layers`` in order, with the attention mask built the way the backbone
    builds it for its own attention implementation (eager, SDPA, ...)."""
    mask = create_bidirectional_mask(
        config=encoder.backbone.config, inputs_embeds=hidden, attention_mask=attention_mask
    )
    for layer in layers:
        out = layer(hidden, attention_mask=mask)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


@torch.no_grad()
def lower_states(
    encoder: TextEncoder, texts: list[str], n: int, max_length: int | None = None, batch_size: int = 256
) -> list[torch.Tensor]:
    """Each text's hidden states after the embeddings and the lowest ``n`` layers, eval mode, on the
    CPU, its padding dropped (``(length_i, dim)``, whichever side the tokenizer padded)."""
    layers = transformer_layers(encoder)
    was_training = encoder.training
    encoder.eval()
    device = next(encoder.parameters()).device
    out: list[torch.Tensor] = []
    try:
        for i in range(0, len(texts), batch_size):
            tokens = encoder.tokenize(texts[i : i + batch_size], max_length)
            ids, mask = tokens["input_ids"].to(device), tokens["attention_mask"].to(device)
            hidden = run_layers(encoder, layers[:n], encoder.backbone.embeddings(input_ids=ids), mask).cpu()
            # The attended positions, wherever the tokenizer padded (right for BERT, left for some
            # checkpoints): stored right-aligned, they are what pad_states right-pads again.
            out += [h[m.bool()] for h, m in zip(hidden, mask.cpu(), strict=True)]
    finally:
        encoder.train(was_training)
    return out


def pad_states(states: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad cached states into ``(B, L, dim)`` and their ``(B, L)`` attention mask."""
    hidden = nn.utils.rnn.pad_sequence(states, batch_first=True)
    lengths = torch.tensor([len(s) for s in states])
    mask = (torch.arange(hidden.shape[1])[None, :] < lengths[:, None]).long()
    return hidden, mask


def upper_forward(
    encoder: TextEncoder, hidden: torch.Tensor, attention_mask: torch.Tensor, n: int
) -> torch.Tensor:
    """Pooled embeddings from the states after layer ``n``: the top layers, then the encoder's pooling
    (equal to ``encoder(input_ids, attention_mask)`` when ``hidden`` came from :func:`lower_states`)."""
    top = run_layers(encoder, transformer_layers(encoder)[n:], hidden, attention_mask)
    return encoder.pool(top, attention_mask)
