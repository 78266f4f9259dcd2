"""Placement groups an interrupted sweep leaves reserved, released before the command returns.

Ray Train (2.60) hands a run's worker-group placement group to its ``PlacementGroupCleaner`` (the
detached actor that removes the group when the run's controller dies) only after the workers have
started. A trial stopped inside that window (Ctrl+C or the time budget as the trial starts) takes
its controller with it, and the group it had just created stays reserved for as long as the job
lives: nothing else owns it. The command then exits and Ray frees it with the job, but a sweep
restored in the same process (a notebook, the tests) waits for those CPUs forever.

So on an interrupted sweep, the groups this job created during it that no live actor occupies are
removed: once every Ray Train controller of the job has gone, such a group can only be an orphan.
It needs Ray's State API (the dashboard); without it, nothing is released and a warning says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import ray
from ray._raylet import PlacementGroupID
from ray.util.placement_group import PlacementGroup

log = logging.getLogger(__name__)

CONTROLLER = "TrainController"  # Ray Train's controller actor class
SETTLE_S = 30.0  # how long stopped trials get to take their controllers down


def job_groups() -> set[str]:
    """Ids of this job's placement groups that are not removed."""
    from ray.util.state import list_placement_groups

    job = ray.get_runtime_context().get_job_id()
    groups = list_placement_groups(filters=[("creator_job_id", "=", job)], limit=10_000)
    return {g.placement_group_id for g in groups if g.state != "REMOVED"}


def _live_actors() -> list:
    from ray.util.state import list_actors

    job = ray.get_runtime_context().get_job_id()
    actors = list_actors(filters=[("job_id", "=", job), ("state", "!=", "DEAD")], detail=True, limit=10_000)
    return list(actors)


def _controllers(actors: list) -> set[str]:
    """Ids of the Ray Train controllers among ``actors``."""
    return {a.actor_id for a in actors if a.class_name == CONTROLLER}


def release_orphans(
    before: set[str], settle_s: float = SETTLE_S, old: frozenset[str] = frozenset()
) -> list[str]:
    """Remove this job's placement groups created since ``before`` (:func:`job_groups`) that no
    live actor occupies, once no Ray Train controller of the job is alive but those in ``old``
    (alive before the sweep, not its own), waiting up to ``settle_s``; if one still is, nothing
    is removed. Returns the removed groups' ids."""
    deadline = time.monotonic() + settle_s
    while True:
        actors = _live_actors()
        if not _controllers(actors) - old:
            break
        if time.monotonic() > deadline:
            log.warning("tune: a Ray Train controller is still alive; no placement group released")
            return []
        time.sleep(0.5)
    occupied = {a.placement_group_id for a in actors if a.placement_group_id}
    orphans = sorted(job_groups() - before - occupied)
    for group_id in orphans:
        group = PlacementGroup(PlacementGroupID(bytes.fromhex(group_id)))
        ray.util.remove_placement_group(group)
    if orphans:
        log.warning("tune: released %d placement group(s) left by interrupted trials", len(orphans))
    return orphans


@contextmanager
def releasing_orphans() -> Iterator[None]:
    """Around a sweep's ``fit``: on an exception (the sweep interrupted), :func:`release_orphans`
    of the groups created inside, then the exception goes on."""
    try:
        before, old = job_groups(), frozenset(_controllers(_live_actors()))
    except Exception as e:  # no State API (no dashboard): the sweep runs, nothing is released
        log.warning("tune: cannot list placement groups (%s); an interrupted trial's may stay reserved", e)
        before = None
    try:
        yield
    except BaseException:
        if before is not None:
            release_orphans(before, old=old)
        raise
