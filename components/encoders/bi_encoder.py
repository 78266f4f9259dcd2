"""The bi-encoder behind dense retrieval: a text tower and an optional learned tool-ID head.

Queries and tool documents go through one shared :class:`TextEncoder` (a Siamese bi-encoder, as
COLT's semantic stage uses) and are L2-normalised. The optional ID head is one learned vector per
training tool, scored against the same query embedding: it memorises which tools co-occur with
which phrasings, while the text tower generalises to tools it never saw (cold start).
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from components.encoders import TextEncoder
from components.encoders.layer_cache import upper_forward

HEADS = "heads.safetensors"
META = "bi_encoder.json"


class BiEncoder(nn.Module):
    """Shared text encoder + optional tool-ID embeddings.

    Args:
        encoder: The text tower.
        id_tool_ids: Tool ids the ID head has a row for (training tools), or None for no ID head.
    """

    def __init__(self, encoder: TextEncoder, id_tool_ids: list[str] | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        # Training-time setting (see components.encoders.layer_cache): inputs given as states
        # start after this many frozen layers. Not saved: a loaded model runs every layer.
        self.frozen_layers = 0
        self.id_tool_ids = list(id_tool_ids or [])
        self.id_embeddings = nn.Embedding(len(self.id_tool_ids), encoder.dim) if id_tool_ids else None
        if self.id_embeddings is not None:
            nn.init.normal_(self.id_embeddings.weight, std=0.02)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Normalised text embeddings, ``(batch, dim)``."""
        return F.normalize(self.encoder(input_ids, attention_mask), dim=-1)

    @torch.no_grad()
    def embed_texts(self, texts: list[str], max_length: int | None = None) -> torch.Tensor:
        """Normalised embeddings of raw texts (eval mode, batched), on CPU."""
        return F.normalize(self.encoder.encode(texts, max_length=max_length), dim=-1).cpu()

    def forward(
        self,
        query_ids: torch.Tensor | None,
        query_mask: torch.Tensor,
        tool_ids: torch.Tensor | None = None,
        tool_mask: torch.Tensor | None = None,
        query_states: torch.Tensor | None = None,
        tool_states: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Query embeddings, in-batch tool embeddings (None without tools) and the normalised ID
        table (or None).

        ``*_states`` stand in for ``*_ids``: cached hidden states after the encoder's
        ``frozen_layers`` lowest layers, so only the top layers run. Everything the loss needs
        comes out of one call so that DDP sees every used parameter.
        """
        ids = F.normalize(self.id_embeddings.weight, dim=-1) if self.id_embeddings is not None else None
        query = self._side(query_ids, query_mask, query_states)
        tools = self._side(tool_ids, tool_mask, tool_states) if tool_mask is not None else None
        return query, tools, ids

    def _side(
        self, token_ids: torch.Tensor | None, mask: torch.Tensor, states: torch.Tensor | None
    ) -> torch.Tensor:
        if states is None:
            assert token_ids is not None, "token ids or cached states"
            return self.embed(token_ids, mask)
        return F.normalize(upper_forward(self.encoder, states, mask, self.frozen_layers), dim=-1)

    def save(self, path: str) -> None:
        """Encoder in HF layout under ``encoder/``, ID table in safetensors, ids in JSON."""
        os.makedirs(path, exist_ok=True)
        self.encoder.save(os.path.join(path, "encoder"))
        heads = (
            {} if self.id_embeddings is None else {"id_embeddings": self.id_embeddings.weight.detach().cpu()}
        )
        save_file(heads, os.path.join(path, HEADS))
        with open(os.path.join(path, META), "w") as f:
            json.dump({"id_tool_ids": self.id_tool_ids}, f)

    @classmethod
    def load(cls, path: str) -> BiEncoder:
        """Inverse of :meth:`save`."""
        with open(os.path.join(path, META)) as f:
            meta = json.load(f)
        model = cls(TextEncoder.load(os.path.join(path, "encoder")), meta["id_tool_ids"] or None)
        heads = load_file(os.path.join(path, HEADS))
        if model.id_embeddings is not None:
            model.id_embeddings.weight.data.copy_(heads["id_embeddings"])
        return model


def contrastive_loss(
    query: torch.Tensor, keys: torch.Tensor, target: torch.Tensor, relevant: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Multiple-negatives ranking loss with in-batch false negatives masked.

    Args:
        query: ``(B, d)`` normalised query embeddings.
        keys: ``(K, d)`` normalised candidate embeddings (in-batch tools, or the whole ID table).
        target: ``(B,)`` index of each query's positive among the keys.
        relevant: ``(B, K)`` bool, True where a key is relevant to the query. Those other than the
            target are masked out: another tool the same query needs is not a negative.
        temperature: Softmax temperature.
    """
    # In fp32 even under bf16 autocast: at 1/temperature = 20, bf16 rounds logits near 16-20 to
    # steps of 0.125, so cosines closer than ~0.006 (the hard negatives) looked equal to the loss.
    with torch.autocast(query.device.type, enabled=False):
        logits = query.float() @ keys.float().T / temperature
    positive = F.one_hot(target, keys.shape[0]).bool()
    logits = logits.masked_fill(relevant & ~positive, float("-inf"))
    return F.cross_entropy(logits, target)
