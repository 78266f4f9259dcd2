"""The one Ray Tune trainable: a trial trains a method's stages through the Ray Train runner.

Each trial is a Tune function trainable that calls the method's ``fit`` stage by stage, exactly as
``toolscout train`` does, so every stage is a ``TorchTrainer`` run (:mod:`components.training.runner`)
with its per-epoch checkpoints, resume and scaling settings. The alternative, calling the stage
functions in the trial's own process, would skip about 10 s of Ray Train start-up per trial, but it
would be a second training path with its own device, checkpoint and resume behaviour; a trial of
the profiles swept here trains for minutes, so the one runner is kept.

Under ASHA the last stage forwards each epoch's validation report to Tune
(``RunSpec.report_to_tune``), which is what the scheduler stops a trial on; under FIFO only the
final report goes, so any metric the whole-method score has can be swept on. Earlier stages do
not report: a stage every trial shares (MassTool's semantic stage) is trained once before the
sweep and found in its cache here. When the last stage is done the trial indexes the catalogue,
scores the whole method on ``valid`` as ``toolscout bench`` does, and reports that with the saved
artifact as the trial's checkpoint.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace
from typing import Any

from ray import tune

from components import methods
from components.data import Dataset
from components.metrics import joint_score
from workflows.evaluate import score
from workflows.train import run_spec
from workflows.tune.space import apply_params

FINAL = "final"  # 1.0 in the report of a trial that trained to the end and was scored as a whole


def trial_method(base: dict[str, Any], params: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The trial's full config (``base`` with the sampled ``params``) and its method, built."""
    cfg = apply_params(base, params)
    mcfg = cfg["method"]
    return cfg, methods.build(mcfg["name"], mcfg.get("params"))


def valid_report(valid: dict[str, float]) -> dict[str, float]:
    """A trial's whole-method valid scores as Tune keys: ``valid_<metric>`` for every metric, the
    selection metric among them, and ``valid_joint`` for a method scored on detection too."""
    report = {f"valid_{k}": float(v) for k, v in valid.items()}
    if "detect_accuracy" in valid and "ndcg@3" in valid:
        # ``tune.metric: valid/joint`` selects on both towers; the joint stage's epochs report the
        # same figure under the same key, which is what ASHA stops trials on.
        report["valid_joint"] = joint_score(valid["ndcg@3"], valid["detect_accuracy"])
    return report


def run_trial(
    params: dict[str, Any],
    *,
    base: dict[str, Any],
    dataset: Dataset,
    experiment: str,
    shared_stages: tuple[str, ...] = (),
    epoch_metric: str | None = None,
    seed: int | None = None,
) -> None:
    """Train, score on valid and report one trial (called by Ray Tune with the sampled ``params``).

    Args:
        params: The sampled ``{dotted config key: value}``.
        base: The sweep's base config (``method``, ``train``, ...); ``train.storage_path`` is the
            sweep's own, so every trial's Ray Train checkpoints live under the sweep.
        dataset: The dataset, loaded once by the driver and shared through the object store.
        experiment: The sweep's name: trial runs are named ``<experiment>-<trial id>``, so a trial
            that is restarted (``Tuner.restore``) resumes its Ray Train run from its last epoch.
        shared_stages: Stages the driver trained before the sweep; a trial that does not find one
            in the method's cache (``{"reused": 1.0}``) fails instead of training it again.
        epoch_metric: The key the scheduler stops trials on, forwarded with each epoch of the last
            stage; None (FIFO): only the final, whole-method report goes to Tune.
        seed: The seed of the stages the trial trains itself (the seed re-check's); the shared
            stages keep ``train.seed``, the one they were trained and cached with. None: every
            stage runs with ``train.seed``.
    """
    cfg, method = trial_method(base, params)
    trial_id = tune.get_context().get_trial_id()
    run = run_spec(cfg, f"{experiment}-{trial_id}")
    started = time.perf_counter()
    stages: dict[str, Any] = {}
    own = run if seed is None else replace(run, seed=seed)
    for stage in method.stages:
        last = stage == method.stages[-1]
        stage_run = run if stage in shared_stages else own
        stages[stage] = method.fit(
            stage, dataset, replace(stage_run, report_to_tune=epoch_metric if last else None)
        )
        if stage in shared_stages and not stages[stage].get("reused"):
            raise RuntimeError(
                f"tune: shared stage {stage!r} was trained again in trial {trial_id}: the swept keys "
                f"{sorted(params)} change it; drop it from tune.shared_stages"
            )
    method.index(dataset.corpus)
    train_seconds = time.perf_counter() - started
    valid = score(method, dataset, "valid")
    report = valid_report(valid) | {FINAL: 1.0, "train_seconds": train_seconds}
    with tempfile.TemporaryDirectory() as tmp:
        artifact = os.path.join(tmp, "artifact")
        method.save(artifact)
        tune.report(report, checkpoint=tune.Checkpoint.from_directory(artifact))


def run_recheck(config: dict[str, Any], **kwargs: Any) -> None:
    """One run of the seed re-check: ``config["recheck"]`` holds a trial's ``params`` and the
    ``seed`` to train them with again (:mod:`workflows.tune.recheck`)."""
    run_trial(config["recheck"]["params"], seed=int(config["recheck"]["seed"]), **kwargs)
