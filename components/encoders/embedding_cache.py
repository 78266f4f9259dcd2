"""A disk cache of a text encoder's embeddings, keyed by the encoder's weights and the texts.

Why: a stage that keeps its encoder frozen (MassTool's joint stage on the CPU profile, arXiv
2507.00487, with ``finetune_encoder: false``) embeds the same texts with the same weights in every
epoch's validation and in every Ray Tune trial: the 16,893 ToolLens training queries alone take
about 5 minutes through MiniLM on 2 cores, against about 30 s for an epoch of the joint stage's
own training. With this cache a sweep pays for each embedding once.

The key is content, not a name: a hash of every weight of the encoder (so a fine-tuned or
different encoder never reads another's vectors), its pooling, and per call its runtime, n-gram
order and the sequence length texts are cut at (the encoder's own when the call names none: a
sweep over ``max_length`` read the first trial's vectors), and the exact texts of the call. A hit
returns exactly what :meth:`TextEncoder.encode` returned when the entry was written. Entries are
written to a temporary name and renamed, so trials running at once on one node never read a
half-written file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np
import torch

from components.encoders.text_encoder import TextEncoder


def encoder_fingerprint(encoder: TextEncoder) -> str:
    """A hash of the encoder's weights, tokenizer size, pooling and runtime (~0.1 s for MiniLM)."""
    digest = hashlib.sha256()
    about = (type(encoder.backbone).__name__, len(encoder.tokenizer), encoder.pooling, encoder.runtime)
    digest.update(repr(about).encode())
    for name, tensor in sorted(encoder.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(repr((name, str(flat.dtype), tuple(tensor.shape))).encode())
        digest.update(flat.view(torch.uint8).numpy().data)
    return digest.hexdigest()[:24]


def call_settings(encoder: TextEncoder, max_length: int | None) -> tuple:
    """What else decides a call's vectors, read at the call: the length texts are cut at (the
    encoder's own ``max_length`` when the call names none), the runtime and the n-gram order
    (neither is a weight, and both can change after the cache was opened)."""
    order = encoder.ngrams.order if encoder.ngrams is not None else None
    return (max_length or encoder.max_length, encoder.runtime, order)


def texts_key(texts: list[str], settings: tuple) -> str:
    """A hash of the call: the texts in order and :func:`call_settings`."""
    digest = hashlib.sha256(repr(settings).encode())
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")  # so that ["ab", "c"] and ["a", "bc"] differ
    return digest.hexdigest()[:24]


class EmbeddingCache:
    """Embeddings of a frozen encoder under ``root/<encoder fingerprint>/<texts key>.npy``.

    The fingerprint is taken once, when the cache is opened for an encoder; :meth:`encode` checks
    that the encoder was not put back into training since (a stage that fine-tunes it must not
    use a cache).
    """

    def __init__(self, root: str, encoder: TextEncoder) -> None:
        if any(p.requires_grad for p in encoder.parameters()):
            raise ValueError("an embedding cache needs a frozen encoder (requires_grad False everywhere)")
        self.encoder = encoder
        self.dir = os.path.join(os.path.abspath(root), encoder_fingerprint(encoder))
        os.makedirs(self.dir, exist_ok=True)
        self.hits = 0
        self.misses = 0

    def encode(self, texts: list[str], max_length: int | None = None) -> torch.Tensor:
        """``encoder.encode(texts, max_length=max_length)`` on the CPU, read from disk when cached."""
        if any(p.requires_grad for p in self.encoder.parameters()):
            raise RuntimeError("the cached encoder was unfrozen after the cache was opened")
        path = os.path.join(self.dir, texts_key(texts, call_settings(self.encoder, max_length)) + ".npy")
        if os.path.exists(path):
            self.hits += 1
            return torch.from_numpy(np.load(path))
        self.misses += 1
        out = self.encoder.encode(texts, max_length=max_length).cpu()
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.save(f, out.numpy())
        os.replace(tmp, path)
        return out
