"""Retrieval methods: the protocol, and a registry from method name to import string.

Entries resolve lazily, so importing this package imports no method (and no torch model code):
adding a method is one package under ``components/methods/`` and one line here.
"""

from __future__ import annotations

from typing import Any

from components.methods.base import CAPABILITIES, Method, check_capabilities, check_instance, read_config
from components.registry import resolve
from components.training.spec import import_object

REGISTRY: dict[str, str] = {
    "bm25": "components.methods.bm25.method:BM25Method",
    "dense": "components.methods.dense.method:DenseMethod",
    "masstool": "components.methods.masstool.method:MassToolMethod",
    "toolgen": "components.methods.toolgen.method:ToolGenMethod",
    "toolweaver": "components.methods.toolweaver.method:ToolWeaverMethod",
    "querygen": "components.methods.querygen.method:QueryGenMethod",
}

__all__ = ["CAPABILITIES", "REGISTRY", "Method", "artifact_method", "build", "load", "method_class"]


def method_class(name: str) -> type:
    """The class registered as ``name`` (imported on first use)."""
    if name not in REGISTRY:
        raise KeyError(f"unknown method {name!r}; registered: {sorted(REGISTRY)}")
    cls = import_object(REGISTRY[name])
    check_capabilities(cls)
    return cls


def build(name: str, params: dict[str, Any] | None = None) -> Method:
    """Instantiate a registered method from config parameters."""
    cls = method_class(name)
    try:
        method = cls(**(params or {}))
    except TypeError as e:  # e.g. "unexpected keyword argument 'profile'": name the method and config
        raise ValueError(f"method {name!r}: bad method.params: {e}") from e
    check_instance(method)
    return method


def artifact_method(path: str) -> tuple[str, str]:
    """``(version dir, method name)`` of a saved method (a dir, or a ``models:/`` URI resolved through
    the registry in ``$MLFLOW_TRACKING_URI``), without loading it.

    Raises:
        KeyError: its ``config.json`` names no registered method.
    """
    path = resolve(path)
    name = read_config(path).get("method")
    if name not in REGISTRY:
        raise KeyError(f"{path}: config.json names unknown method {name!r}; registered: {sorted(REGISTRY)}")
    return path, name


def load(path: str) -> Method:
    """Load any saved method (an artifact dir or a ``models:/`` registry URI)."""
    path, name = artifact_method(path)
    method = method_class(name).load(path)
    check_instance(method)
    return method
