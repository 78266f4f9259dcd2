"""Model references to local directories: a ``models:/`` URI through the registry, a path as given."""

from __future__ import annotations

from typing import Any

from components.registry.settings import RegistrySettings, Version, is_model_uri
from components.registry.store import ModelRegistry


def resolve(ref: str, settings: RegistrySettings | dict[str, Any] | None = None) -> str:
    """A local directory for ``ref``: a ``models:/`` URI through the registry, a path as given.

    Raises:
        LookupError: a URI names a model, version or alias the registry does not have.
        ValueError: a malformed ``models:/`` URI.
    """
    return resolve_version(ref, settings)[0]


def resolve_version(
    ref: str, settings: RegistrySettings | dict[str, Any] | None = None
) -> tuple[str, Version | None]:
    """:func:`resolve`'s directory with the registry version it is (``None`` for a plain path), from
    one registry read, so the two cannot name different versions when an alias moves meanwhile."""
    if not is_model_uri(ref):
        return ref, None
    if not isinstance(settings, RegistrySettings):
        settings = RegistrySettings.from_config(settings)
    registry = ModelRegistry(settings)
    version = registry.lookup(ref)
    return registry.local_dir(version), version
