"""A config section as MLflow params and back: nested dicts as dotted keys, values as text.

MLflow keeps a run's params flat and as strings. :func:`components.config.flatten` writes a section
that way, and
:func:`unflatten` reads it back typed (YAML scalars: ``0.1`` is a float, ``None`` null), so a
later job can compare what a version was trained with against its own settings (a retrain's
splits against the champion's, :mod:`workflows.retrain.job`).
"""

from __future__ import annotations

from typing import Any

import yaml

from components.config import parse_yaml


def unflatten(params: dict[str, str], prefix: str) -> Any:
    """The section under ``prefix`` of params :func:`components.config.flatten` wrote and MLflow
    stored as text, typed again.

    Raises:
        KeyError: no param has that prefix (the section was not logged).
    """
    if prefix in params:  # logged whole: null, an empty dict or a scalar
        return _value(params[prefix])
    section: dict[str, Any] = {}
    for key, text in params.items():
        if not key.startswith(prefix + "."):
            continue
        *parents, leaf = key[len(prefix) + 1 :].split(".")
        node = section
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _value(text)
    if not section:
        raise KeyError(prefix)
    return section


def _value(text: str) -> Any:
    """One logged value typed again: ``str()`` of a Python value (``None``, ``{'a': 0.1}``) read as
    YAML, which takes Python's quoted dict keys and ``True``/``False`` but not ``None``. YAML 1.2's
    scalars, as configs are read (:func:`components.config.parse_yaml`): YAML 1.1 gave back
    ``1e-05`` as text, ``'on'`` as True and ``'2024-01-01'`` as a date, so a champion's splits
    compared unequal to the same settings."""
    if text == "None":
        return None
    try:
        return parse_yaml(text)
    except yaml.YAMLError:  # text YAML 1.2 refuses (on, yes): it was that text
        return text
