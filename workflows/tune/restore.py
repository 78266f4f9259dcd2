"""What a sweep of a given name was started with, so that a rerun restores only that sweep.

``Tuner.restore`` brings back the saved space, sample count, metric, searcher and scheduler, and
ignores the ones in the config of the command that restores it. The driver, though, reads the
config's: a rerun after an edit (more samples, another metric, a swapped key) restored the old
sweep and then counted, selected or wrote the best YAML by the new settings (``num_samples``
raised: "run again" forever; a key swapped: ``null`` in the best YAML). So the first start writes
what the sweep is made of beside Tune's state, and a restore refuses a config that differs.
"""

from __future__ import annotations

import json
from typing import Any

from components.config import ConfigError
from components.data import io
from workflows.tune.settings import TuneSettings

FINGERPRINT = "toolscout_sweep.json"
# The tune settings that make a sweep what it is (not its outputs, title or time budget).
SHAPING = (
    "space", "entry", "metric", "mode", "num_samples", "search", "scheduler", "seed",
    "grace_period", "reduction_factor", "max_t", "shared_stages",
    # The selection rule too: a finished sweep's test was read for the trial it selected.
    "recheck_top", "recheck_seeds",
)  # fmt: skip


def fingerprint(settings: TuneSettings, base: dict[str, Any]) -> dict[str, Any]:
    """The settings that make a sweep what it is."""

    def public(section: dict[str, Any] | None) -> dict[str, Any]:
        # Not credentials (storage options, train.env's tokens) nor where this machine keeps
        # local copies: rotating a token or moving a scratch dir does not make another sweep.
        return {k: v for k, v in (section or {}).items() if k not in ("storage_options", "env", "local_dir")}

    own = {k: getattr(settings, k) for k in SHAPING}
    for key in ("recheck_top", "recheck_seeds"):
        if not own[key]:
            # Absent from sweeps started before the re-check existed: without it, they restore.
            del own[key]
    parts = {"method": base.get("method"), "train": public(base.get("train")), "splits": base.get("splits")}
    parts["data"] = public(base.get("data"))
    # Through JSON: tuples and lists, int and float keys compare as they will when read back.
    return json.loads(json.dumps({"tune": own, **parts}, sort_keys=True, default=str))


def write_fingerprint(settings: TuneSettings, base: dict[str, Any]) -> None:
    """Record what a new sweep is started with (beside Tune's state, local or s3://)."""
    path = io.join(settings.experiment_path, FINGERPRINT)
    data = json.dumps(fingerprint(settings, base), indent=1, sort_keys=True).encode()
    io.write_bytes(path, data, base["train"].get("storage_options") or {})


def check_restorable(settings: TuneSettings, base: dict[str, Any]) -> None:
    """Refuse to restore a sweep that was started with other settings than this config's.

    Raises:
        ConfigError: naming the settings that differ, and how to go on.
    """
    path = io.join(settings.experiment_path, FINGERPRINT)
    options = base["train"].get("storage_options") or {}
    if not io.exists(path, options):
        return  # a sweep started before fingerprints were written: nothing to compare
    then, now = json.loads(io.read_bytes(path, options)), fingerprint(settings, base)
    differ = [
        f"{section}.{key}"
        for section in sorted(set(then) | set(now))
        for key in sorted(set(then.get(section) or {}) | set(now.get(section) or {}))
        if (then.get(section) or {}).get(key) != (now.get(section) or {}).get(key)
    ]
    if differ:
        raise ConfigError(
            f"tune: the sweep {settings.name!r} at {settings.experiment_path} was started with other "
            f"settings ({', '.join(differ)} differ); restoring it would run the old sweep under the new "
            "config's name. Put them back to finish it, or set tune.name=<new name> for a new sweep"
        )


def saved_trials(settings: TuneSettings, base: dict[str, Any]) -> list[tuple[str, str]]:
    """``(trial id, status)`` of the trials in the sweep's newest saved state. A sweep whose
    driver died before its first trial (state written, searcher not yet given its space) has
    none: it is started anew rather than restored into a searcher with no space."""
    return trial_states(settings.experiment_path, base["train"].get("storage_options") or {})


def trial_states(path: str, options: dict[str, Any]) -> list[tuple[str, str]]:
    """``(trial id, status)`` in the newest saved state of the Tune experiment at ``path``.

    What tells a finished experiment from an interrupted one: after Ctrl+C, ``Tuner.fit``'s
    results count a trial that was running as terminated (with no result), while the saved state
    keeps it ``RUNNING``, and a restore runs it again."""
    fs = io.filesystem(path, options)
    states = sorted(fs.glob(io.join(path, "experiment_state-*.json")))
    if not states:
        return []
    with fs.open(states[-1], "rb") as f:  # glob gives paths inside the filesystem
        state = json.load(f)
    # Each entry is [trial state as a JSON string, run metadata as a JSON string].
    trials = [json.loads(entry[0]) for entry in state.get("trial_data") or []]
    return [(t["trial_id"], t["status"]) for t in trials]


def finished(saved: list[tuple[str, str]], expected: int) -> bool:
    """Whether every trial of the sweep ran to an end (completed, stopped or failed)."""
    return len(saved) >= expected and all(status in ("TERMINATED", "ERROR") for _, status in saved)
