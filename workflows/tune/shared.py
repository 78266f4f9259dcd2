"""Checking ``tune.shared_stages`` before a sweep: a stage trained once for every trial must be one
the method caches, and no swept key may change it.

Otherwise the first trial trained the stage again (its settings differed from the one the driver
trained), and the sweep failed only then (:func:`workflows.tune.trainable.run_trial`), after
both trainings. Here, each swept key is given a second value with the others held, and the
method's :meth:`stage_settings` of each shared stage is compared: a key that moves them is named.
"""

from __future__ import annotations

from typing import Any

from components.config import ConfigError
from workflows.train import run_spec
from workflows.tune.space import is_grid, sample_once
from workflows.tune.trainable import trial_method

# Draws from a continuous or wide domain differ at once; a choice of one value never does.
DRAWS = 20


def another_value(domain: Any, value: Any) -> Any:
    """A value of ``domain`` other than ``value``, or ``value`` when it has no other."""
    if is_grid(domain):
        return next((v for v in domain["grid_search"] if v != value), value)
    for _ in range(DRAWS):
        other = domain.sample()
        if other != value:
            return other
    return value


def check_shared_stages(base: dict[str, Any], space: dict[str, Any], shared: tuple[str, ...]) -> None:
    """Refuse shared stages the method does not cache, or that a swept key changes.

    Raises:
        ConfigError: naming the stage and the keys (or why the stage is not cached).
    """
    if not shared:
        return
    sample = sample_once(space)

    def settings(params: dict[str, Any]) -> dict[str, Any]:
        cfg, method = trial_method(base, params)
        if "shared_stages" not in method.capabilities:
            raise ConfigError(
                f"tune.shared_stages: {method.name} caches no training stage, so each trial trains "
                "all of them; leave tune.shared_stages empty"
            )
        seed = run_spec(cfg, "check").seed
        try:
            return {stage: method.stage_settings(stage, seed) for stage in shared}
        except ValueError as e:
            raise ConfigError(f"tune.shared_stages: {e}") from e

    reference = settings(sample)
    changing: dict[str, list[str]] = {stage: [] for stage in shared}
    for key, domain in space.items():
        other = another_value(domain, sample[key])
        if other == sample[key]:
            continue
        moved = settings({**sample, key: other})
        for stage in shared:
            if moved[stage] != reference[stage]:
                changing[stage].append(key)
    for stage, keys in changing.items():
        if keys:
            raise ConfigError(
                f"tune.shared_stages: {stage!r} is trained once for every trial, but tune.space "
                f"{sorted(keys)} change it (each trial would train it again); sweep them without "
                f"sharing {stage!r}, or drop them from the space"
            )
    runner = sorted(k for k in space if k.startswith("train."))
    if runner:
        # The runner's settings (precision, batching, workers) shape every stage, the shared
        # ones too, which train once with the base value: the best YAML would name a value its
        # shared stage never trained with, and a fresh `toolscout train` would not reproduce it.
        raise ConfigError(
            f"tune.shared_stages: {list(shared)} train once with the base train section, but "
            f"tune.space sweeps {runner}; sweep them without shared stages"
        )
