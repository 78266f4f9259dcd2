"""What a sentence-transformers checkpoint says about itself: the pooling it was trained with.

A checkpoint in that layout (``modules.json``, ``1_Pooling/config.json``) pools its transformer's
output itself; :class:`components.encoders.text_encoder.TextEncoder` pools here, so it must pool the
same way, and nothing else may sit on top (a ``Dense`` projection would be silently skipped).
"""

from __future__ import annotations

import json
import os

# What a sentence-transformers checkpoint may stack on its transformer and still be what
# TextEncoder computes (pooling here, normalisation by every caller).
SENTENCE_MODULES = ("Transformer", "Pooling", "Normalize")


def checkpoint_pooling(name_or_path: str) -> str | None:
    """The pooling a sentence-transformers checkpoint declares (``1_Pooling/config.json``), read
    from its directory or the Hugging Face cache (no download), else None (the default, mean).

    Without it, a CLS-pooled checkpoint named by its full name (e.g. BAAI/bge-*, or
    sentence-transformers/msmarco-distilbert-base-tas-b, which the ``tas-b`` preset pools by CLS)
    was mean-pooled: another vector space than the one it was trained for.

    Raises:
        ValueError: the checkpoint stacks a module TextEncoder does not compute (e.g. ``Dense``).
    """

    def read(name: str) -> dict | list | None:
        local = os.path.join(name_or_path, name)
        if not os.path.isdir(name_or_path):
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name_or_path, name)
            local = cached if isinstance(cached, str) else ""
        if not local or not os.path.isfile(local):
            return None
        with open(local) as f:
            return json.load(f)

    modules = read("modules.json") or []
    extra = [m.get("type", "") for m in modules if not m.get("type", "").endswith(SENTENCE_MODULES)]
    if extra:
        raise ValueError(
            f"encoder {name_or_path!r} stacks {extra} on its transformer, which toolscout does not "
            "compute: its vectors would not be the checkpoint's"
        )
    config = read("1_Pooling/config.json")
    if not isinstance(config, dict):
        return None
    if config.get("pooling_mode_cls_token"):
        return "cls"
    if config.get("pooling_mode_mean_tokens"):
        return "mean"
    modes = sorted(k for k, v in config.items() if k.startswith("pooling_mode") and v)
    raise ValueError(f"encoder {name_or_path!r} pools by {modes}; toolscout pools by cls or mean")
