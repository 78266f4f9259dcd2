"""One progress bar for a sweep (Tune's own trial tables are turned off): trials finished, each
one's status, and the best valid metric so far."""

from __future__ import annotations

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
