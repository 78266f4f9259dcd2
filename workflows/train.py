"""``toolscout train``: run a method's stages in order on Ray Train, index, register a model version.

Each stage is one ``TorchTrainer`` run named ``<run_name>-<stage>`` under ``train.storage_path``;
starting ``toolscout train`` again with the same ``train.run_name`` resumes those runs from their
last checkpoints. The trained method is logged to the model registry (MLflow, see
:mod:`components.registry`) as a new version of ``<dataset>-<method>`` (or ``registry.model_name``);
``models:/<name>/latest`` and ``models:/<name>@champion`` are what evaluate and serving load.
"""

from __future__ import annotations

import logging
import numbers
import os
import re
import secrets
import time
from dataclasses import fields
from typing import Any

from components import methods
from components.config import ConfigError
from components.data import Dataset, dataset_from_config
from components.methods.base import Method, RunSpec
from components.registry import ChampionMoved, ModelRegistry, RegistrySettings, Version

log = logging.getLogger(__name__)

# The ``train`` section's keys: RunSpec's fields (``name`` comes from the job; ``run_name`` sets it, and
# ``report_to_tune`` is set by ``toolscout tune``).
TRAIN_KEYS = {f.name for f in fields(RunSpec)} - {"name", "report_to_tune"} | {"run_name"}


def new_run(cfg: dict[str, Any], name: str) -> RunSpec:
    """:func:`run_spec` for a run of its own: ``name`` plus a time stamp and a random suffix (two
    trainings started in the same second, a seed sweep, must not share one run), so that two
    trainings never resume each other's Ray Train runs (what an explicit ``train.run_name`` is for)."""
    return run_spec(cfg, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")


def run_spec(cfg: dict[str, Any], name: str, scope: str | None = None) -> RunSpec:
    """The ``train`` section of a config as a :class:`RunSpec`.

    Args:
        name: The run's name when ``train.run_name`` is not set.
        scope: What tells this run apart inside one job (a bench entry and grid combo): appended
            to ``train.run_name``, so that two trainings never share, and resume, one run.
    """
    t = cfg.get("train", {})
    unknown = sorted(set(t) - TRAIN_KEYS)
    if unknown:
        # A misspelt or unsupported key must not be dropped silently (a run would train otherwise
        # than its config says).
        raise ConfigError(f"train.{unknown[0]}: unknown setting; known: {', '.join(sorted(TRAIN_KEYS))}")
    storage = t.get("storage_path", "runs/train")

    def flag(key: str, default: bool) -> bool:
        value = t.get(key, default)
        if not (isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", "") == "b"):
            raise ConfigError(f"train.{key}: expected true or false; got {value!r}")  # bool("false") is True
        return bool(value)

    def whole(key: str, default: int) -> int:
        value = t.get(key, default)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # int(1.7) was seed 1
            raise ConfigError(f"train.{key}: expected an integer; got {value!r}")
        return int(value)

    if t.get("run_name"):
        name = f"{t['run_name']}-{scope}" if scope else t["run_name"]
    return RunSpec(
        name=name,
        storage_path=storage if "://" in storage else os.path.abspath(storage),
        num_workers=whole("num_workers", 1),
        use_gpu=flag("use_gpu", False),
        resources_per_worker=dict(t.get("resources_per_worker") or {}),
        max_failures=whole("max_failures", 0),
        keep_checkpoints=t.get("keep_checkpoints"),
        local_dir=os.path.abspath(t.get("local_dir", "runs/checkpoints")),
        env={k: str(v) for k, v in (t.get("env") or {}).items()},
        storage_options=dict(t.get("storage_options") or {}),
        seed=whole("seed", 0),
        deterministic=flag("deterministic", True),
        precision=str(t.get("precision", "fp32")),
        grad_accumulation=whole("grad_accumulation", 1),
        gradient_checkpointing=flag("gradient_checkpointing", False),
        parallel_strategy=str(t.get("parallel_strategy", "ddp")),
    )


def fit_method(method: Method, dataset: Dataset, run: RunSpec) -> dict[str, Any]:
    """Run every stage of ``method`` in order, then index the corpus; returns per-stage metrics.

    A method carries its own state from one stage to the next (each stage starts from the
    previous stage's best checkpoint).
    """
    report: dict[str, Any] = {"stages": {}}
    started = time.perf_counter()
    for stage in method.stages:
        report["stages"][stage] = method.fit(stage, dataset, run)
    method.index(dataset.corpus)
    report["train_seconds"] = time.perf_counter() - started
    return report


def model_name(cfg: dict[str, Any], dataset_name: str) -> str:
    """The registered model's name: ``registry.model_name``, else ``<dataset>-<method>``."""
    name = (cfg.get("registry") or {}).get("model_name")
    if name:
        return str(name)
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{dataset_name}-{cfg['method']['name']}").strip("-")


def register(
    registry: ModelRegistry,
    cfg: dict[str, Any],
    method: Method,
    name: str,
    report: dict[str, Any],
    tags: dict[str, str] | None = None,
) -> Version:
    """Save ``method`` and register it as a new version of ``name`` (an MLflow run: params are the
    method section, data path and splits; metrics each stage's reported numbers, ``<stage>/<metric>``,
    and the training time). A failure part-way leaves no version."""
    metrics = {"train_seconds": float(report.get("train_seconds", 0.0))}
    for stage, values in (report.get("stages") or {}).items():
        for key, value in (values or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[f"{stage}/{key}".replace("@", "_at_")] = float(value)
    params = {
        "method": cfg["method"],
        "data": {"path": (cfg.get("data") or {}).get("path")},
        "splits": cfg.get("splits"),
    }
    return registry.log_saved(name, method.save, params=params, metrics=metrics, tags=tags)


def crown(registry: ModelRegistry, name: str, number: int, promote: bool = False) -> None:
    """Make version ``number`` of ``name`` the champion if ``promote`` (the quickstart), or if it is
    the model's first version: it has nothing to beat. Later ones wait for the retrain gate or a
    hand promotion."""
    if promote:
        registry.promote(name, number)
    elif min(registry.numbers(name)) == number:
        # Only a model's first version has nothing to beat (the oldest: two first trainings at once
        # register v1 and v2, and v1 is crowned). One with older versions but no champion (its alias
        # removed, its version deleted) stays so, as retrain refuses it; and a champion set by
        # another driver since (a gated retrain) is never overwritten.
        try:
            registry.promote(name, number, replacing=None)
        except ChampionMoved:
            log.info("model %r: another driver set a champion first; v%d not promoted", name, number)
    elif "champion" not in registry.aliases(name):
        log.warning(
            "model %r has versions but no champion; v%d is not promoted ungated: promote one with "
            "toolscout registry promote %s N",
            name,
            number,
            name,
        )


def train(cfg: dict[str, Any], promote: bool = False) -> dict[str, Any]:
    """Train the method named in ``cfg["method"]`` and register the artifact as a new model version.

    The first version of a model becomes its ``champion`` (there is nothing to compare it with);
    later ones are promoted by the retrain gate (``toolscout retrain``) or by hand
    (``toolscout registry promote``), or at once with ``promote`` (the quickstart, which has no gate:
    what it just trained and reported is what ``@champion`` serves).

    Returns:
        ``{"artifact": local dir of the version, "model_uri": "models:/<name>/<N>", "version": N,
        "model": name, "stages": {...}, "train_seconds": ...}``.
    """
    mcfg = cfg["method"]
    dataset = dataset_from_config(cfg)
    method = methods.build(mcfg["name"], mcfg.get("params"))
    name = model_name(cfg, dataset.name)
    report = fit_method(method, dataset, new_run(cfg, name))
    registry = ModelRegistry(RegistrySettings.from_config(cfg.get("registry")))
    version = register(registry, cfg, method, name, report)
    crown(registry, name, version.number, promote)
    return {
        "artifact": registry.local_dir(version),
        "model_uri": version.uri,
        "version": version.number,
        "model": name,
        **report,
    }
