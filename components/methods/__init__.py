"""Retrieval methods: an explicit registry of plug-ins implementing :class:`.base.Method`."""

from __future__ import annotations

from typing import Any

from components.methods.base import Method, read_config
from components.methods.bm25 import BM25Method
from components.methods.dense import DenseMethod
from components.methods.masstool import MassToolMethod
from components.methods.toolgen import ToolGenMethod
from components.registry import resolve

REGISTRY: dict[str, type] = {
    BM25Method.name: BM25Method,
    DenseMethod.name: DenseMethod,
    MassToolMethod.name: MassToolMethod,
    ToolGenMethod.name: ToolGenMethod,
}


def build(name: str, params: dict[str, Any] | None = None) -> Method:
    """Instantiate a registered method from config parameters."""
    if name not in REGISTRY:
        raise KeyError(f"unknown method {name!r}; registered: {sorted(REGISTRY)}")
    try:
        return REGISTRY[name](**(params or {}))
    except TypeError as e:  # e.g. "unexpected keyword argument 'profile'": name the method and config
        raise ValueError(f"method {name!r}: bad method.params: {e}") from e


def artifact_method(path: str) -> tuple[str, str]:
    """``(version dir, method name)`` of a saved method, ``LATEST`` resolved, without loading it.

    Raises:
        KeyError: its ``config.json`` names no registered method.
    """
    path = resolve(path)
    name = read_config(path).get("method")
    if name not in REGISTRY:
        raise KeyError(f"{path}: config.json names unknown method {name!r}; registered: {sorted(REGISTRY)}")
    return path, name


def load(path: str) -> Method:
    """Load any saved method (an artifact dir, or a method dir whose ``LATEST`` names one)."""
    path, name = artifact_method(path)
    return REGISTRY[name].load(path)
