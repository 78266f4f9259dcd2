"""The seed re-check: the sweep's top trials trained again with other seeds, selected on the mean.

A sweep's best single valid score is partly its seed's luck: among trials on a plateau (MassTool's
completed trials span 0.002 N@3, about one seed's spread), the maximum is biased upwards, and the
selected setting then reads test below its valid score, often below the hand-picked setting's
(the winner's curse; ``benchmarks/results/toollens_masstool_tune.md``). With ``tune.recheck:
{top: T, seeds: S}`` the ``T`` best completed trials are each trained ``S`` more times, with
``train.seed + 1 .. + S``, and the one with the best mean valid score over its ``S + 1`` runs is
selected. Only the stages a trial trains itself are re-seeded: the shared stages keep the seed they
were trained and cached with (:func:`workflows.tune.trainable.run_trial`), so a re-check costs
``T × S`` trials, not as many shared trainings. The selected trial's own artifact (trained with
``train.seed``, as the hand-picked baseline is) is the one read on test.
"""

from __future__ import annotations

import statistics
from typing import Any

from ray import tune
from ray.tune.schedulers import FIFOScheduler
from ray.tune.search import BasicVariantGenerator

from components.data import Dataset, io
from workflows.report import md_table
from workflows.train import run_spec
from workflows.tune.progress import TimeBudget, TrialProgress
from workflows.tune.restore import finished, trial_states
from workflows.tune.settings import TuneSettings
from workflows.tune.trainable import run_recheck


def candidates(trials: list[dict[str, Any]], settings: TuneSettings) -> list[dict[str, Any]]:
    """The ``recheck_top`` completed trials with the best valid scores, best first."""
    done = [t for t in trials if t["status"] == "completed"]
    done.sort(key=lambda t: t["valid"], reverse=settings.mode == "max")
    return done[: settings.recheck_top]


def recheck_runs(top: list[dict[str, Any]], settings: TuneSettings, seed: int) -> list[dict[str, Any]]:
    """One grid point per (trial, extra seed): what :func:`run_recheck` trains."""
    return [
        {"trial_id": t["trial_id"], "params": t["params"], "seed": seed + k}
        for t in top
        for k in range(1, settings.recheck_seeds + 1)
    ]


def summarise(
    top: list[dict[str, Any]], runs: list[tuple[dict[str, Any], float | None]], mode: str, seed: int
) -> list[dict[str, Any]]:
    """Each candidate's valid scores (its sweep trial's, with ``seed``, first, then each re-check
    seed's), their mean and spread, ranked by the mean. A re-check run that failed adds no score
    (``failed`` counts it) and ranks its candidate below every one whose runs all finished: a
    setting that fails on another seed is the instability the re-check is for, and its mean over
    fewer runs would fall back less (down to its single, best-of-the-sweep score).

    Raises:
        RuntimeError: every re-check run failed (nothing was re-checked).
    """
    if runs and all(v is None for _, v in runs):
        raise RuntimeError(f"tune: all {len(runs)} seed re-check runs failed; see their errors")
    rows = []
    for t in top:
        mine = [(run, value) for run, value in runs if run["trial_id"] == t["trial_id"]]
        values = [float(t["valid"])] + [v for _, v in mine if v is not None]
        rows.append(
            {
                "trial_id": t["trial_id"],
                "params": t["params"],
                "seeds": [seed] + [run["seed"] for run, v in mine if v is not None],
                "valid_runs": values,
                "valid_mean": statistics.fmean(values),
                "valid_sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                "failed": sum(v is None for _, v in mine),
            }
        )
    sign = -1.0 if mode == "max" else 1.0
    rows.sort(key=lambda r: (r["failed"] > 0, sign * r["valid_mean"]))
    return rows


def recheck(
    trials: list[dict[str, Any]],
    settings: TuneSettings,
    base: dict[str, Any],
    dataset: Dataset,
    actor: dict[str, float],
    concurrent: int,
    fs: Any,
    inside: Any,
) -> list[dict[str, Any]] | None:
    """Re-check the sweep's top ``trials``: each candidate's row (:func:`summarise`, best mean
    first), or None when the re-check was interrupted. ``actor`` and ``concurrent``: a trial's
    resources and how many run at once, as in the sweep; ``fs`` and ``inside``: its storage."""
    top = candidates(trials, settings)
    trainable = tune.with_resources(
        tune.with_parameters(
            run_recheck,
            base=base,
            dataset=dataset,
            experiment=f"{settings.name}-recheck",
            shared_stages=settings.shared_stages,
        ),
        actor,
    )
    seed = run_spec(base, "recheck").seed
    runs = run_rechecks(trainable, top, settings, base, seed, concurrent, fs, inside)
    return None if runs is None else summarise(top, runs, settings.mode, seed)


def run_rechecks(
    trainable: Any,
    top: list[dict[str, Any]],
    settings: TuneSettings,
    base: dict[str, Any],
    seed: int,
    concurrent: int,
    fs: Any,
    inside: Any,
) -> list[tuple[dict[str, Any], float | None]] | None:
    """Train the re-check runs as a second Tune experiment inside the sweep's directory
    (``<sweep>/recheck``: it lives and goes with its sweep), restored if an earlier command was
    interrupted in it. Returns each run with its valid score (None: it failed), or None when it
    was interrupted before every run finished.

    Raises:
        RuntimeError: the saved re-check trains other runs than this sweep's top trials.
    """
    options = base["train"].get("storage_options") or {}
    grid = recheck_runs(top, settings, seed)
    name = "recheck"
    where = io.join(settings.experiment_path, name)
    path = inside(where)
    if tune.Tuner.can_restore(path, storage_filesystem=fs):
        tuner = tune.Tuner.restore(
            path,
            trainable=trainable,
            resume_unfinished=True,
            # Finished (the outputs failed after it): its failed runs stay failed, or a rerun could
            # select another trial and read test for it too.
            resume_errored=not finished(trial_states(where, options), len(grid)),
            storage_filesystem=fs,
        )
    else:
        tuner = tune.Tuner(
            trainable,
            param_space={"recheck": tune.grid_search(grid)},
            tune_config=tune.TuneConfig(
                metric=settings.report_key,
                mode=settings.mode,
                search_alg=BasicVariantGenerator(max_concurrent=concurrent),
                scheduler=FIFOScheduler(),
                max_concurrent_trials=concurrent,
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=inside(settings.experiment_path),
                storage_filesystem=fs,
                verbose=0,
                callbacks=[TrialProgress(len(grid), settings.report_key, settings.mode), TimeBudget()],
            ),
        )
    results = tuner.fit()
    if not finished(trial_states(where, options), len(grid)):
        return None  # the saved state, not the results' count (restore.trial_states)
    out = []
    for result in results:
        value = None if result.error is not None else (result.metrics or {}).get(settings.report_key)
        out.append((result.config["recheck"], None if value is None else float(value)))
    ran = sorted((run["trial_id"], run["seed"]) for run, _ in out)
    if ran != sorted((run["trial_id"], run["seed"]) for run in grid):
        raise RuntimeError(
            f"tune: the saved seed re-check at {where} trained other runs than this sweep's top "
            "trials; remove it to re-check again"
        )
    return out


def recheck_table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    """The re-check as markdown: each candidate's parameters, valid scores by seed, mean and sd."""

    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    body = [
        [
            r["trial_id"],
            *(cell(r["params"][k]) for k in keys),
            ", ".join(f"{v:.4f} (seed {s})" for s, v in zip(r["seeds"], r["valid_runs"], strict=True)),
            f"{r['valid_mean']:.4f}",
            f"{r['valid_sd']:.4f}",
            str(r["failed"]),
        ]
        for r in rows
    ]
    head = ["trial", *(k.split(".")[-1] for k in keys), "valid by seed", "mean", "sd", "failed"]
    return "\n".join(md_table(head, body)) + "\n"
