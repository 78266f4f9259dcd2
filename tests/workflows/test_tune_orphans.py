"""An interrupted sweep releases the placement groups its cut-off trials left reserved, and only
those: groups from before the sweep, and groups a live actor occupies, stay."""

from __future__ import annotations

import pytest
import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from workflows.tune.orphans import releasing_orphans


@ray.remote(num_cpus=0.1)
class Holder:
    def ping(self) -> str:
        return "here"


def state(group) -> str:
    return placement_group_table(group)["state"]


def test_an_interrupted_sweep_removes_only_the_groups_it_left_unoccupied(ray_session):
    older = placement_group([{"CPU": 0.1}])
    ray.get(older.ready(), timeout=60)  # bounded: CPUs left reserved fail here, not hang
    with pytest.raises(KeyboardInterrupt), releasing_orphans():
        orphan = placement_group([{"CPU": 0.1}])  # a worker group whose controller died
        occupied = placement_group([{"CPU": 0.1}])
        ray.get([orphan.ready(), occupied.ready()], timeout=60)
        holder = Holder.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=occupied)
        ).remote()
        assert ray.get(holder.ping.remote()) == "here"
        raise KeyboardInterrupt  # Ctrl+C in the sweep
    try:
        assert state(orphan) == "REMOVED"
        assert state(occupied) == "CREATED" and state(older) == "CREATED"
    finally:
        ray.kill(holder)
        for group in (older, occupied):
            remove_placement_group(group)


def test_a_sweep_that_ends_normally_removes_nothing(ray_session):
    with releasing_orphans():
        group = placement_group([{"CPU": 0.1}])
        ray.get(group.ready(), timeout=60)
    try:
        assert state(group) == "CREATED"
    finally:
        remove_placement_group(group)
