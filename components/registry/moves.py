"""Alias moves that a crash cannot leave half done.

A promotion writes two aliases (``previous``, then ``champion``) and a rollback two more, each its
own MLflow call. A driver killed between them left ``champion`` and ``previous`` on one version:
rollback then refused to move, and the demoted version was in no alias at all. So a move first
records where every alias it touches must end (a tag on the registered model), then writes them,
then removes the record; the next move under the alias lock finds a record left behind and
finishes it first. Callers hold :class:`components.registry.lock.AliasLock`.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from components.registry.store import ModelRegistry

log = logging.getLogger(__name__)

MOVE_TAG = "toolscout.alias_move"  # {alias: version or null} a move set out to write


def move(registry: ModelRegistry, name: str, wanted: dict[str, int | None]) -> None:
    """Point each alias of ``wanted`` at its version (``None``: remove it), recorded first."""
    registry.client.set_registered_model_tag(name, MOVE_TAG, json.dumps(wanted))
    for alias, number in wanted.items():
        registry.set_alias(name, alias, number)
    registry.client.delete_registered_model_tag(name, MOVE_TAG)


def settle(registry: ModelRegistry, name: str) -> bool:
    """Finish a move of ``name`` that a crash interrupted, if its record is there; ``True`` then."""
    from mlflow.exceptions import MlflowException

    try:
        tags = registry.client.get_registered_model(name).tags or {}
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":  # no model yet: nothing was moving
            return False
        raise
    if MOVE_TAG not in tags:
        return False
    wanted = json.loads(tags[MOVE_TAG])
    log.warning("model %r: finishing an alias move a stopped driver left half done: %s", name, wanted)
    move(registry, name, wanted)
    return True
