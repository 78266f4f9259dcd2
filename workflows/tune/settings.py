"""The ``tune`` section of a config, checked once and typed (:class:`TuneSettings`)."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

from components.config import ConfigError
from components.data import io

SEARCHERS = ("optuna", "random")
SCHEDULERS = ("asha", "fifo")


@dataclass(frozen=True)
class TuneSettings:
    """What to sweep, how to search and stop, and where trials and results go.

    Attributes:
        name: The sweep's name; its trials and checkpoints live under ``storage_path/name``.
        entry: A ``bench.methods`` entry the sweep starts from (its method and params), or None
            for the config's ``method`` section.
        space: ``{dotted config key: {distribution: args}}`` (:mod:`workflows.tune.space`).
        metric: ``valid/<metric>`` the scheduler and the selection use; ``mode`` is max or min.
        num_samples: Trials to run (each value of a ``grid_search`` this many times).
        search: ``optuna`` (TPE through ``OptunaSearch``) or ``random``.
        scheduler: ``asha`` (stop a trial whose epoch reports trail the others) or ``fifo``.
        grace_period, reduction_factor, max_t: ASHA's settings, in epochs (``max_t`` defaults to
            the most epochs a trial can run + 1, :func:`workflows.tune.sweep.most_epochs`: the
            last report is the whole method scored on valid).
        seed: Seeds the search, Optuna's and random sampling alike.
        trial_resources: The trial actor's own resources; the training workers' come from
            ``train.num_workers`` and ``train.resources_per_worker``.
        max_concurrent: Trials at once; None derives it from the cluster's CPUs (or GPUs).
        shared_stages: Stages trained once before the sweep and reused by every trial (the
            method must cache them by their settings, as MassTool's ``semantic_cache`` does).
        storage_path: Local directory or ``s3://`` prefix of the sweep.
        time_budget_s: Stop the sweep (as interrupted, restorable) after this many seconds.
        resume: Restore an interrupted sweep of the same name instead of refusing to start.
        baseline: A ``bench.methods`` entry (the hand-picked config) trained and scored in the
            same run, for the comparison in the report; None for none.
        out: The results JSON; the table (.md), plots (.png) and best config (_best.yaml) go
            beside it.
        recheck_top, recheck_seeds: The seed re-check (``recheck: {top: 3, seeds: 2}``): the
            ``top`` completed trials are trained again with ``seeds`` other seeds, and the one
            with the best mean valid score is selected (:mod:`workflows.tune.recheck`); 0: the
            best single valid score is.
    """

    name: str
    space: dict[str, Any]
    entry: str | None = None
    metric: str = "valid/ndcg@3"
    mode: str = "max"
    num_samples: int = 16
    search: str = "optuna"
    scheduler: str = "asha"
    grace_period: int = 1
    reduction_factor: int = 2
    max_t: int | None = None
    trial_resources: dict[str, float] = field(default_factory=lambda: {"CPU": 0})
    max_concurrent: int | None = None
    shared_stages: tuple[str, ...] = ()
    storage_path: str = "runs/tune"
    resume: bool = True
    baseline: str | None = None
    seed: int = 0
    time_budget_s: float | None = None
    out: str | None = None
    title: str = ""
    recheck_top: int = 0
    recheck_seeds: int = 0

    @property
    def experiment_path(self) -> str:
        return io.join(self.storage_path, self.name)

    @property
    def report_key(self) -> str:
        """``valid/ndcg@3`` → ``valid_ndcg@3``: the key trials report per epoch and at the end."""
        return "valid_" + self.metric.partition("/")[2]


def recheck_settings(section: Any) -> dict[str, int]:
    """``tune.recheck`` (``{top: N, seeds: M}``, or null for none) as the settings' two fields."""
    if section is None:
        return {}
    if not isinstance(section, dict) or set(section) - {"top", "seeds"}:
        raise ConfigError(f"tune.recheck: expected {{top: <trials>, seeds: <seeds each>}}, got {section!r}")
    out = {}
    for key in ("top", "seeds"):
        value = section.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"tune.recheck.{key}: expected a whole number >= 0, got {value!r}")
        out[f"recheck_{key}"] = value
    if (out["recheck_top"] == 0) != (out["recheck_seeds"] == 0):
        # One without the other re-checks nothing: a config that meant a re-check must not skip it.
        raise ConfigError(f"tune.recheck: top and seeds must both be set (>= 1), got {section!r}")
    return out


def tune_settings(cfg: dict[str, Any], default_name: str) -> TuneSettings:
    """Read and check ``cfg["tune"]``; every error names the key."""
    raw = copy.deepcopy(cfg.get("tune") or {})
    if int((cfg.get("train") or {}).get("num_workers", 1)) == 0:
        # Ray refuses ray.train's APIs (get_context, report) inside a Tune function trainable.
        raise ConfigError(
            "train.num_workers: 0 (Ray Train's local mode) cannot run inside Tune trials; "
            "a sweep trains on Ray Train workers: use num_workers >= 1"
        )
    workers = (raw.get("space") or {}).get("train.num_workers")
    if isinstance(workers, dict) and len(workers) == 1:
        ((kind, args),) = workers.items()
        # A swept 0 passed this check (made on the base config) and failed inside its trials.
        if isinstance(args, list) and (0 in args if kind in ("choice", "grid_search") else args[:1] < [1]):
            raise ConfigError(
                "tune.space.train.num_workers: its values include 0 (Ray Train's local mode), "
                "which cannot run inside Tune trials; sweep num_workers >= 1"
            )
    if not raw.get("space"):
        raise ConfigError("tune.space is not set: name at least one dotted config key to sweep")
    known = set(TuneSettings.__dataclass_fields__) - {"recheck_top", "recheck_seeds"} | {"recheck"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"tune: unknown keys {unknown}; known: {sorted(known)}")
    sched = raw.pop("scheduler", None) or {}
    if isinstance(sched, str):
        sched = {"name": sched}
    raw["scheduler"] = sched.get("name", "asha")
    for key in ("grace_period", "reduction_factor", "max_t"):
        if key in sched:
            raw[key] = sched[key]
    raw.update(recheck_settings(raw.pop("recheck", None)))
    raw["name"] = raw.get("name") or default_name
    raw["shared_stages"] = tuple(raw.get("shared_stages") or ())
    storage = raw.get("storage_path") or "runs/tune"
    # file:///nfs/tune is a local path (abspath of the URL made "<cwd>/file:/nfs/tune").
    raw["storage_path"] = storage if io.is_remote(storage) else os.path.abspath(io.local_path(storage))
    settings = TuneSettings(**raw)
    if settings.search not in SEARCHERS:
        raise ConfigError(f"tune.search: {settings.search!r} is not one of {SEARCHERS}")
    if settings.scheduler not in SCHEDULERS:
        raise ConfigError(f"tune.scheduler: {settings.scheduler!r} is not one of {SCHEDULERS}")
    if settings.mode not in ("max", "min"):
        raise ConfigError(f"tune.mode: expected max or min, got {settings.mode!r}")
    if settings.recheck_top and "train.seed" in settings.space:
        # Its runs take train.seed + 1, + 2 ... of the base config: a swept seed could repeat one.
        raise ConfigError("tune.recheck: train.seed is swept (tune.space); a seed re-check needs it fixed")
    if int(settings.num_samples) < 1:
        raise ConfigError(f"tune.num_samples: expected at least 1, got {settings.num_samples}")
    split, _, name = settings.metric.partition("/")
    if split != "valid" or not name:
        raise ConfigError(f"tune.metric: expected valid/<metric> (never test), got {settings.metric!r}")
    # Checked here, not when the sweep's outputs are written: by then test has been read for the
    # best trial, and a rerun would restore the sweep and read it again.
    entries = (cfg.get("bench") or {}).get("methods") or {}
    for key in ("entry", "baseline"):
        value = getattr(settings, key)
        if value is not None and value not in entries:
            raise ConfigError(f"tune.{key}: {value!r} is not a bench.methods entry ({sorted(entries)})")
    return settings
