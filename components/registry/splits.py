"""How a registered version's data was split, against the splits a later job would use.

Valid is carved from train by ``splits`` (seed, valid_fraction, ...): scored under other settings,
a version is scored on requests it trained on, and the score is a memorised one. The version's
splits are read back from its run's params (:meth:`ModelRegistry.params`).
"""

from __future__ import annotations

from typing import Any

from components.data.splits import split_settings
from components.registry.store import ModelRegistry


def splits_differ(
    registry: ModelRegistry, version: Any, splits: dict[str, Any] | None
) -> dict[str, tuple[Any, Any]] | None:
    """``{setting: (the version's, given)}`` for each split setting that differs, or None when they
    agree or the version logged none (registered by hand, or its run is gone: nothing to compare)."""
    try:
        logged = registry.params(version, "splits")
    except LookupError:
        return None
    trained_with, given = split_settings(logged if isinstance(logged, dict) else None), split_settings(splits)
    differ = {k: (trained_with[k], given[k]) for k in given if trained_with[k] != given[k]}
    return differ or None
