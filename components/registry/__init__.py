"""The model registry (MLflow) and the retrain lock; see :mod:`.store`."""

from components.registry.lock import LockHeld, RetrainLock
from components.registry.resolve import resolve, resolve_version
from components.registry.settings import ALIASES, RegistrySettings, Version, is_model_uri, parse_model_uri
from components.registry.store import ModelRegistry

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
