"""A disk cache of a text encoder's embeddings, keyed by the encoder's weights and the texts.

Why: a stage that keeps its encoder frozen (MassTool's joint stage on the CPU profile, arXiv
2507.00487, with ``finetune_encoder: false``) embeds the same texts with the same weights in every
epoch's validation and in every Ray Tune trial: the 16,893 ToolLens training queries alone take
about 5 minutes through MiniLM on 2 cores, against about 30 s for an epoch of the joint stage's
own training. With this cache a sweep pays for each embedding once.

The key is content, not a name: a hash of every weight of the encoder (so a fine-tuned or
different encoder never reads another's vectors), its tokenizer's vocabulary and settings (two
tokenizers of one size split texts differently), its pooling, and per call its runtime, n-gram
order and the sequence length texts are cut at (the encoder's own when the call names none: a
sweep over ``max_length`` read the first trial's vectors), and the exact texts of the call. A hit
returns exactly what :meth:`TextEncoder.encode` returned when the entry was written. Entries are
written to a temporary name and renamed, so trials running at once on one node never read a
half-written file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from typing import Any

import numpy as np
import torch

from components.encoders.text_encoder import TextEncoder, weight_versions


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """The tokenizer as text: a fast tokenizer's definition (vocabulary, normaliser, pre-tokeniser,
    special tokens) without the truncation and padding of its last call (the call's own settings
    key each entry), else its sorted vocabulary and special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = json.loads(backend.to_str())
        return json.dumps(
            {k: v for k, v in definition.items() if k not in ("truncation", "padding")}, sort_keys=True
        )
    return repr((sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens))


def encoder_fingerprint(encoder: TextEncoder) -> str:
    """A hash of the encoder's weights, tokenizer, pooling and runtime (~0.1 s for MiniLM)."""
    digest = hashlib.sha256()
    # The side padding goes on moves a BERT's absolute positions, and the side a long text is
    # cut on decides which of its tokens are kept: another side, other vectors.
    sides = (encoder.tokenizer.padding_side, encoder.tokenizer.truncation_side)
    about = (type(encoder.backbone).__name__, encoder.pooling, encoder.runtime, sides)
    digest.update(repr(about).encode())
    digest.update(tokenizer_fingerprint(encoder.tokenizer).encode())
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

    The fingerprint is taken when the cache is opened for an encoder and again when its weights
    change in place (new weights loaded into the same modules: their own directory); :meth:`encode`
    checks that the encoder was not put back into training since (a stage that fine-tunes it must
    not use a cache).
    """

    def __init__(self, root: str, encoder: TextEncoder) -> None:
        if any(p.requires_grad for p in encoder.parameters()):
            raise ValueError("an embedding cache needs a frozen encoder (requires_grad False everywhere)")
        self.encoder = encoder
        self.root = os.path.abspath(root)
        self._open()
        self.hits = 0
        self.misses = 0

    def encode(self, texts: list[str], max_length: int | None = None) -> torch.Tensor:
        """``encoder.encode(texts, max_length=max_length)`` on the CPU, read from disk when cached."""
        if any(p.requires_grad for p in self.encoder.parameters()):
            raise RuntimeError("the cached encoder was unfrozen after the cache was opened")
        if weight_versions(self.encoder) != self._versions:
            self._open()  # weights changed in place since the fingerprint: key them anew
        path = os.path.join(self.dir, texts_key(texts, call_settings(self.encoder, max_length)) + ".npy")
        if os.path.exists(path):
            self.hits += 1
            return torch.from_numpy(np.load(path))
        self.misses += 1
        out = self.encoder.encode(texts, max_length=max_length).cpu()
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, out.numpy())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)  # a full disk must not also leave half-written files behind
            raise
        return out

    def _open(self) -> None:
        self._versions = weight_versions(self.encoder)
        self.dir = os.path.join(self.root, encoder_fingerprint(self.encoder))
        os.makedirs(self.dir, exist_ok=True)
