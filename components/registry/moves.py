"""Alias moves that a crash cannot leave half done.

A promotion writes two aliases (``previous``, then ``champion``) and a rollback two more, each its
own MLflow call. A driver killed between them left ``champion`` and ``previous`` on one version:
rollback then refused to move, and the demoted version was in no alias at all. So a move first
records where every alias it touches must end (a tag on the registered model), then writes them,
then removes the record; the next move under the alias lock finds a record left behind and
finishes it first. Callers hold :class:`components.registry.lock.AliasLock`; ``registry`` is the
:class:`components.registry.store.ModelRegistry` that calls them (not imported here: a cycle).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from components.registry.lock import AliasLock, LockHeld
from components.registry.settings import Version

log = logging.getLogger(__name__)

MOVE_TAG = "toolscout.alias_move"  # {alias: [version before, version after]} of a move under way


def move(registry: Any, name: str, wanted: dict[str, int | None]) -> None:
    """Point each alias of ``wanted`` at its version (``None``: remove it), recorded first with
    where each alias was, so that finishing it later never undoes a move made since."""
    before = registry.aliases(name)
    record = {alias: [before.get(alias), number] for alias, number in wanted.items()}
    registry.client.set_registered_model_tag(name, MOVE_TAG, json.dumps(record))
    for alias, number in wanted.items():
        registry.set_alias(name, alias, number)
    registry.client.delete_registered_model_tag(name, MOVE_TAG)


def settle(registry: Any, name: str) -> bool:
    """Finish a move of ``name`` that a crash interrupted, if its record is there; ``True`` then.

    An alias is written only while it still points where the move found it or where it was headed:
    one moved since by a writer that does not settle first (a retrain setting ``challenger``) keeps
    its new place. A version the move named that is gone by now is left out."""
    from mlflow.exceptions import MlflowException

    try:
        tags = registry.client.get_registered_model(name).tags or {}
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":  # no model yet: nothing was moving
            return False
        raise
    if MOVE_TAG not in tags:
        return False
    record = json.loads(tags[MOVE_TAG])
    log.warning("model %r: finishing an alias move a stopped driver left half done: %s", name, record)
    now = registry.aliases(name)
    for alias, (before, after) in record.items():
        if now.get(alias) not in (before, after):
            continue
        try:
            registry.set_alias(name, alias, after)
        except MlflowException as e:  # the version was deleted meanwhile
            log.warning("model %r: %s stays as it is: %s", name, alias, e.message)
    registry.client.delete_registered_model_tag(name, MOVE_TAG)
    return True


def settled_alias(registry: Any, name: str, alias: str) -> Version | None:
    """The version ``alias`` of ``name`` points at once a move a crash left half done is finished
    (under the alias lock), or None. A reader that gates or trains against the champion (a
    retrain round) would otherwise read where the stopped move left it, not where it was going,
    and find out only at its promotion, after the whole round (``ChampionMoved``)."""
    try:
        with AliasLock(registry.settings.alias_lock):
            settle(registry, name)
            return registry.alias(name, alias)
    except LockHeld as e:
        # A move is under way (its holder finishes it) or its holder died on another host: read
        # the alias as it is. A round can still train and register; its promotion needs the lock.
        log.warning("model %r: reading %s without settling: %s", name, alias, e)
        return registry.alias(name, alias)
