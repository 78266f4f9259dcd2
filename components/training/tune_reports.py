"""Each epoch's report of a stage that runs inside a Ray Tune trial, forwarded to the trial.

A module of its own, importing neither torch nor the training loop: Ray Train pickles the run's
callbacks to its controller and workers, and a callback defined in :mod:`components.training.runner`
made each of them import the runner (torch, the loop, the storage layer) on the way to the first
epoch. Here unpickling one imports Ray Tune's callback only.
"""

from __future__ import annotations

from typing import Any

from components.training.spec import RunSpec


def tune_callbacks(run: RunSpec) -> list:
    """Ray Train callbacks that forward each epoch's report to the Ray Tune trial running this
    stage, each checked for the key its scheduler reads (``run.report_to_tune``)."""
    if not run.report_to_tune:
        return []
    from ray.tune.integration.ray_train import TuneReportCallback

    key = run.report_to_tune

    class EpochReports(TuneReportCallback):
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            check_epoch_report(key, metrics[0])
            super().after_report(run_context, metrics, checkpoint)

    return [EpochReports()]


def check_epoch_report(key: str, metrics: dict[str, Any]) -> None:
    """Refuse an epoch report without the key the trial's scheduler stops on.

    Tune's own check stops the whole sweep at the first such result and names an environment
    variable; this fails the trial, naming the keys the stage does report (the user's choice)."""
    if key not in metrics:
        reported = sorted(k for k in metrics if k.startswith("valid_"))
        raise ValueError(
            f"tune.metric valid/{key.removeprefix('valid_')}: this stage reports {reported} each "
            "epoch, which ASHA stops trials on; sweep on one of those, or set tune.scheduler=fifo "
            "(trials are then compared on their final, whole-method scores)"
        )
