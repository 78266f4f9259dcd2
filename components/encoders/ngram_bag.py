"""A bag of hashed token n-grams: the fastText channel of a text encoder.

fastText (Joulin et al., "Bag of Tricks for Efficient Text Classification", EACL 2017) averages
embeddings of a text's word n-grams, hashed into a fixed number of buckets. Here the n-grams are
taken over the encoder's own token ids (uni-, bi- and tri-grams by default), so the channel needs
nothing but ``input_ids`` and ``attention_mask``: it works with a tokenizer trained here or one
loaded by ``from_pretrained``, and every caller of the encoder stays as it is.

Why it is there: a small transformer trained from scratch on a few thousand queries learns word
order and paraphrase slowly, while exact phrases ("using the ingredient", "fantasy league")
decide much of tool choice, and a bag learns those in one epoch. Summed with the transformer's
pooled output it makes the hybrid encoder of :class:`components.encoders.TextEncoder`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The base of a polynomial rolling hash, and a salt times n added per order, so that an n-gram and
# a shorter one with the same rolling value land in different buckets.
_BASE = 1_000_003
_ORDER_SALT = 0x9E3779B1


def hash_ngrams(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, buckets: int, order: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bucket ids of every token n-gram (n = 1..order) and which of them are real.

    An n-gram is real when all of its tokens are (padding is never part of one), so a text's
    bag is the same however much padding its batch adds. The [CLS]/[SEP] tokens a BERT
    tokenizer adds take part, marking the start and end of the text as fastText's ``<``/``>``.

    Args:
        input_ids: ``(B, L)`` token ids.
        attention_mask: ``(B, L)`` 1 for tokens, 0 for padding.
        buckets: Number of hash buckets.
        order: Longest n-gram.

    Returns:
        ``(ids (B, N), real (B, N) bool)`` with ``N = order · L``: every start position of every
        order, those that run past the text (or into padding) not real.
    """
    ids, mask = input_ids.long(), attention_mask.bool()
    length = ids.shape[1]
    # Padded with order - 1 columns outside the text, every order takes all L start positions:
    # the loop does not depend on L. It did (orders up to min(order, L)), and an ONNX export
    # traced it with its sample's length, so a shorter batch sliced a negative width and failed in
    # ONNX Runtime, and orders beyond the sample's length were dropped from every served query.
    ids = torch.nn.functional.pad(ids, (0, order - 1))
    mask = torch.nn.functional.pad(mask, (0, order - 1))
    hashed, real = [], []
    for n in range(1, order + 1):
        h = torch.zeros_like(ids[:, :length])
        keep = torch.ones_like(mask[:, :length])
        for k in range(n):
            # int64 wraps on overflow for long n-grams: still deterministic, just another hash.
            h = h * _BASE + ids[:, k : k + length] + 1
            keep = keep & mask[:, k : k + length]
        hashed.append((h + n * _ORDER_SALT).remainder(buckets))
        real.append(keep)
    return torch.cat(hashed, dim=1), torch.cat(real, dim=1)


def hybrid_sum(pooled: torch.Tensor, bag: torch.Tensor) -> torch.Tensor:
    """The hybrid encoder's vector: the transformer's pooled output and the n-gram bag, each
    normalised before the sum, so neither dominates by scale (a LayerNorm'd transformer output has
    norm ~sqrt(dim), a fresh bag ~0.02) and the cosine of two sums is close to the mean of the
    channels' cosines."""
    return F.normalize(pooled, dim=-1) + F.normalize(bag, dim=-1)


class TokenNgramBag(nn.Module):
    """Mean of hashed token n-gram embeddings, ``(B, L) -> (B, dim)``.

    Args:
        buckets: Hash buckets (rows of the embedding table).
        dim: Output size (the encoder's hidden size, so the channels can be summed).
        order: Longest n-gram.
    """

    def __init__(self, buckets: int, dim: int, order: int = 3) -> None:
        super().__init__()
        if buckets < 1 or order < 1:
            raise ValueError(f"n-gram bag needs buckets >= 1 and order >= 1, got {buckets} and {order}")
        self.buckets, self.order = buckets, order
        self.embedding = nn.Embedding(buckets, dim)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        ids, real = hash_ngrams(input_ids, attention_mask, self.buckets, self.order)
        weights = real.unsqueeze(-1).to(self.embedding.weight.dtype)
        # (B, N, dim) summed over real n-grams, divided by their count.
        return (self.embedding(ids) * weights).sum(1) / weights.sum(1).clamp(min=1.0)
