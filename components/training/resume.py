"""Resuming a stage: the newest persisted checkpoint, and a guard against resuming other settings."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields, is_dataclass
from typing import Any

import ray.train

from components.config import flatten
from components.data import io
from components.training import checkpoints
from components.training.spec import StageConfig


def resume_checkpoint(config: StageConfig) -> ray.train.Checkpoint | None:
    """The newest complete checkpoint in the run's storage, else the one Ray hands over.

    Every checkpoint Ray registered is also in storage, so the newest one there is never older
    than Ray's; it is newer when a worker died between reporting and the controller's next poll.
    """
    found = None
    if config.storage_path:
        found = checkpoints.latest(config.storage_path, config.run_name, config.storage_options)
    if found is None:
        return ray.train.get_checkpoint()
    if not io.is_remote(found[0]):
        return ray.train.Checkpoint(found[0])
    fs = io.arrow_filesystem(found[0], config.storage_options)
    return ray.train.Checkpoint(found[0].split("://", 1)[1], filesystem=fs)


_SKIP = object()  # what settings_fingerprint leaves out

# Settings added after checkpoints were already written: at their default they leave the hash as it
# was, so those checkpoints stay resumable; any other value is a change of what is trained.
OMITTED_AT_DEFAULT: dict[str, Any] = {"grad_accumulation": 1, "lora": {}}

# Settings a run may change when it resumes: more epochs ("train longer"), progress bars, logs,
# deterministic kernels, and where and how its storage is reached (credentials rotate).
RESUMABLE_KEYS = frozenset(
    {
        "epochs",
        "progress",
        "report_log",
        "device",
        "chaos",
        # How the same computation is laid out in memory: recomputed activations, sharded weights.
        "gradient_checkpointing",
        "parallel_strategy",
        "deterministic",
        "storage_options",
        "storage_path",
        "run_name",
        "local",
    }
)


def settings_fingerprint(config: StageConfig | dict[str, Any]) -> str:
    """A hash of the stage's JSON-valued settings (:func:`settings_values`), saved with each
    checkpoint, with the values themselves (so a refusal can name what changed)."""
    return hashlib.sha256(json.dumps(settings_values(config), sort_keys=True).encode()).hexdigest()[:16]


def settings_values(config: StageConfig | dict[str, Any]) -> Any:
    """The stage's JSON-valued settings, as :func:`settings_fingerprint` hashes them.

    Resuming a run under the same name with other settings (another learning rate, model size,
    starting model) would silently continue the old run; run_stage refuses instead. Values that are
    not plain JSON are left out: the dataset travels as an object reference that differs on every
    start, so a change of data is not detected here.
    :data:`RESUMABLE_KEYS` are left out at any depth (methods repeat their settings under ``params``).
    """

    def plain(value: Any) -> Any:
        if is_dataclass(value) and not isinstance(value, type):
            value = {f.name: getattr(value, f.name) for f in fields(value)}
        if isinstance(value, dict):
            kept = (
                (str(k), plain(v))
                for k, v in value.items()
                if k not in RESUMABLE_KEYS and not (k in OMITTED_AT_DEFAULT and v == OMITTED_AT_DEFAULT[k])
            )
            return {k: v for k, v in kept if v is not _SKIP}
        if isinstance(value, list | tuple):
            return [v for v in map(plain, value) if v is not _SKIP]
        if value is None or isinstance(value, bool | int | float | str):
            return value
        return _SKIP

    return plain(config)


def check_resumable(state: dict[str, Any], config: StageConfig) -> None:
    """Raise if a checkpoint was written by a run with other settings (see :func:`settings_fingerprint`),
    naming the settings that differ when the checkpoint kept them, or already holds more epochs
    than ``config`` asks for."""
    if "epoch" in state and int(state["epoch"]) + 1 > int(config.epochs):
        # Nothing would train, and the best of all its epochs (beyond the ones asked for) would
        # come back as a model of this many epochs.
        raise ValueError(
            f"{config.run_name}: its checkpoints already hold {int(state['epoch']) + 1} epochs, more "
            f"than the {config.epochs} asked for; give the run another name (train.run_name) or ask "
            "for at least as many"
        )
    saved = state.get("settings")
    if saved is None or saved == settings_fingerprint(config):
        return
    differ = ""
    if state.get("settings_values") is not None:
        old, new = flatten(state["settings_values"]), flatten(settings_values(config))
        keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        differ = f" ({', '.join(keys)} differ)"
    raise ValueError(
        f"run {config.run_name!r} has checkpoints from other settings{differ}; resuming would continue "
        "that run. Use a new train.run_name (or remove the old run) to start afresh."
    )
