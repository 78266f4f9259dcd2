"""The sweep's own Tune callbacks: one progress bar (Tune's trial tables are turned off) with
trials finished, each one's status and the best valid metric so far; and the time budget."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from ray.tune import Callback
from tqdm import tqdm

from workflows.tune.trainable import FINAL


class TrialProgress(Callback):
    """A tqdm bar over ``num_samples`` trials, updated as each completes, stops or fails."""

    def __init__(self, total: int, metric: str, mode: str) -> None:
        self.total, self.metric, self.mode = total, metric, mode
        self.best: float | None = None
        self.bar: tqdm | None = None

    def setup(self, **info: Any) -> None:
        self.bar = tqdm(total=self.total, desc="tune: trials", unit="trial")

    def _finish(self, trial: Any, status: str) -> None:
        value = (trial.last_result or {}).get(self.metric)
        if status == "done" and value is not None and trial.last_result.get(FINAL) == 1.0:
            better = self.best is None or (value > self.best if self.mode == "max" else value < self.best)
            self.best = value if better else self.best
        if self.bar is not None:
            self.bar.update(1)
            best = "-" if self.best is None else f"{self.best:.4f}"
            self.bar.set_postfix_str(f"last: {status}, best {self.metric}: {best}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finish(trial, "done")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finish(trial, "error")

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if self.bar is not None:
            self.bar.close()


# When the running command's tune.time_budget_s ends (a time.monotonic() reading), set by the
# driver before its first fit(): Tune restores a sweep's callbacks as they were pickled, so a
# restored TimeBudget reads the budget of the command that restores it, not the one that started
# the sweep; and the sweep and its seed re-check, two experiments, share the one deadline.
BUDGET_ENV = "TOOLSCOUT_TUNE_DEADLINE"


class TimeBudget(Callback):
    """Stops the sweep as Ctrl+C does once ``$TOOLSCOUT_TUNE_DEADLINE`` (``time.monotonic()``) has
    passed: ``tune.time_budget_s`` after this command started or restored it (none when unset).

    Not Tune's ``time_budget_s``: at its end Tune marks the searcher finished and every running
    trial terminated, so the restored sweep had nothing left to run and stayed unfinished for
    good ("run the same command again", forever). An interrupt saves the state as it is, and the
    next command restores it and finishes.
    """

    def __init__(self) -> None:
        self.deadline: float | None = None

    def setup(self, **info: Any) -> None:
        deadline = os.environ.get(BUDGET_ENV)
        self.deadline = float(deadline) if deadline else None

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.deadline = None  # once: Tune stops at the end of this step
            os.kill(os.getpid(), signal.SIGINT)
