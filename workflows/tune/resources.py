"""What one trial holds on the cluster, and so how many run at once."""

from __future__ import annotations

import math
from typing import Any

import ray

from workflows.tune.settings import TuneSettings


def train_resources(cfg: dict[str, Any], trains: bool, actor: dict[str, float]) -> dict[str, float]:
    """What one trial holds while it trains: its own ``actor`` plus its Ray Train workers."""
    t = cfg.get("train") or {}
    per_worker = {"CPU": 1.0, **{k: float(v) for k, v in (t.get("resources_per_worker") or {}).items()}}
    if t.get("use_gpu"):
        per_worker.setdefault("GPU", 1.0)
    held = dict(actor)
    if trains:
        for k, v in per_worker.items():
            held[k] = held.get(k, 0.0) + v * int(t.get("num_workers", 1))
    return held


def trial_actor_resources(settings: TuneSettings, trains: bool) -> dict[str, float]:
    """The trial actor's request. A method without a training stage (BM25) works in the trial
    itself: one CPU. One that trains does so in Ray Train's own workers; but Tune cannot place a
    trial that asks for nothing, and any CPU share, however small, would leave a 2-CPU node one
    trial short of two 1-CPU Train runs: so such a trial asks for 1 MiB of memory instead."""
    wanted = {k: float(v) for k, v in settings.trial_resources.items() if float(v) > 0}
    return wanted or ({"memory": float(1 << 20)} if trains else {"CPU": 1.0})


def max_concurrent(held: dict[str, float], settings: TuneSettings) -> int:
    """Trials at once: the configured number, else as many as the cluster's resources hold."""
    if settings.max_concurrent:
        return int(settings.max_concurrent)
    total = ray.cluster_resources()
    fits = [math.floor(total.get(k, 0.0) / v + 1e-9) for k, v in held.items() if v > 0]
    return max(1, min(fits) if fits else 1)
