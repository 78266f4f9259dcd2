"""The model registry (MLflow) and the retrain lock; see :mod:`.store`."""

from components.registry.lock import LockHeld, RetrainLock
from components.registry.store import (
    ALIASES,
    ModelRegistry,
    RegistrySettings,
    Version,
    is_model_uri,
    parse_model_uri,
    resolve,
    resolve_version,
)

__all__ = [
    "ALIASES",
    "LockHeld",
    "ModelRegistry",
    "RegistrySettings",
    "RetrainLock",
    "Version",
    "is_model_uri",
    "parse_model_uri",
    "resolve",
    "resolve_version",
]
