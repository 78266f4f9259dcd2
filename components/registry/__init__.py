"""The model registry (MLflow), the retrain lock and the alias lock; see :mod:`.store`."""

from components.registry.lock import AliasLock, LockHeld, RetrainLock
from components.registry.resolve import resolve, resolve_version
from components.registry.settings import ALIASES, RegistrySettings, Version, is_model_uri, parse_model_uri
from components.registry.store import ChampionMoved, ModelRegistry

__all__ = [
    "ALIASES",
    "AliasLock",
    "ChampionMoved",
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
