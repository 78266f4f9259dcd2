"""Text encoders: Hugging Face backbones by name or path, or small BERTs built and trained here.

The names below load on first use (PEP 562): importing a light submodule such as
``components.encoders.runtimes`` must not pay for torch and transformers, which a serving replica of a
BM25 artifact never needs (they cost ~5 s of CPU per replica start on 2 cores).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from components.encoders.text_encoder import EncoderSpec, TextEncoder
    from components.encoders.tokenizer import train_wordpiece

_LAZY = {
    "EncoderSpec": "components.encoders.text_encoder",
    "TextEncoder": "components.encoders.text_encoder",
    "train_wordpiece": "components.encoders.tokenizer",
}

__all__ = ["EncoderSpec", "TextEncoder", "train_wordpiece"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
