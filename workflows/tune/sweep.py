"""``toolscout tune``: a Ray Tune sweep over any method's config keys (arXiv 2507.00487's λ and ε,
ToolWeaver's λ / ε / K / L, learning rates ...), selected on valid, the best read once on test.

The driver checks the space against the method, trains the stages every trial shares once,
then runs the trials (:func:`workflows.tune.trainable.run_trial`) with Optuna's TPE search and the
ASHA scheduler by default. A sweep of the same name that was interrupted is restored
(``Tuner.restore``): finished trials are kept, unfinished ones start again and their Ray Train runs
resume from their last epoch. The outputs (:mod:`workflows.tune.outputs`) are every trial's
parameters and metric, plots, the best config as a YAML that ``toolscout train`` and
``toolscout bench`` take unchanged, and one test evaluation of that config.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from typing import Any

import ray
from ray import tune
from ray.train.constants import RAY_CHDIR_TO_TRIAL_DIR
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import BasicVariantGenerator

from components.config import ConfigError
from components.data import Dataset, dataset_from_config, io
from workflows.train import run_spec
from workflows.tune.orphans import releasing_orphans
from workflows.tune.outputs import best_trial, reported, trial_rows, write_outputs
from workflows.tune.progress import BUDGET_ENV, TimeBudget, TrialProgress
from workflows.tune.recheck import recheck
from workflows.tune.resources import max_concurrent, train_resources, trial_actor_resources
from workflows.tune.restore import check_restorable, finished, saved_trials, write_fingerprint
from workflows.tune.settings import TuneSettings, tune_settings
from workflows.tune.shared import check_shared_stages
from workflows.tune.space import check_for_optuna, grid_size, has_grid, parse_space, sample_once
from workflows.tune.trainable import run_trial, trial_method


class SweepInterrupted(RuntimeError):
    """The sweep was stopped (Ctrl+C, a lost driver) before every trial finished."""


def base_config(cfg: dict[str, Any], settings: TuneSettings) -> dict[str, Any]:
    """The config every trial starts from: the ``method`` section (or the named bench entry's
    method and params), with the trials' Ray Train runs stored under the sweep."""
    base = copy.deepcopy(cfg)
    if settings.entry:  # tune_settings checked that bench.methods has it
        entry = cfg["bench"]["methods"][settings.entry]
        base["method"] = {"name": entry.get("method", settings.entry), "params": entry.get("params") or {}}
    base.setdefault("train", {})["storage_path"] = io.join(settings.experiment_path, "train")
    base["train"]["run_name"] = None  # trials name their runs after the sweep and trial id
    return base


def check_space(base: dict[str, Any], space: dict[str, Any], settings: TuneSettings) -> Any:
    """Build the method with one sample of every key, so that a key the method does not take fails
    here, naming it, and not in every trial. Returns the built method."""
    for key in space:
        # Not splits.*: the data is split once for the whole sweep (every trial is scored on the
        # same valid queries, or their scores could not be compared).
        if not key.startswith(("method.", "train.")):
            raise ConfigError(f"tune.space.{key}: sweep keys start with method. or train.")
    try:
        _, method = trial_method(base, sample_once(space))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"tune.space: {sorted(space)} do not build a {base['method']['name']}: {e}") from e
    missing = [s for s in settings.shared_stages if s not in method.stages]
    if missing:
        raise ConfigError(f"tune.shared_stages: {missing} are not stages of {method.name} {method.stages}")
    check_shared_stages(base, space, settings.shared_stages)
    if settings.search == "optuna" and has_grid(space):
        raise ConfigError(
            "tune.space: grid_search needs tune.search=random (Optuna samples, it does not enumerate)"
        )
    if settings.search == "optuna":
        check_for_optuna(space, settings.space)
    return method


def most_epochs(method_config: dict[str, Any], space: dict[str, Any] | None) -> int:
    """An upper bound on the epochs a trial's last stage reports: the largest ``epochs`` anywhere in
    the built method's config (its defaults included, and ToolGen's or ToolWeaver's per-stage
    ones), or among the values the space gives a key ending in ``.epochs``.

    ASHA stops every trial at ``max_t``: a bound too small stops each one before its final report,
    so no trial completes (or only the short ones of a swept ``epochs``); one too large only adds
    rungs no trial reaches.
    """

    def found(node: Any) -> list[int]:
        if not isinstance(node, dict):
            return []
        own = [int(v) for k, v in node.items() if k == "epochs" and isinstance(v, int | float)]
        return own + [e for v in node.values() for e in found(v)]

    epochs = [1, *found(method_config)]
    for key, spec in (space or {}).items():
        if key.rsplit(".", 1)[-1] == "epochs" and isinstance(spec, dict):
            for args in spec.values():
                numbers = args if isinstance(args, list) else [args]
                epochs += [int(a) for a in numbers if isinstance(a, int | float)]
    return max(epochs)


def scheduler(settings: TuneSettings, epochs: int) -> Any:
    """FIFO, or ASHA stopping trials on the last stage's per-epoch reports up to ``epochs`` + 1."""
    if settings.scheduler == "fifo":
        return FIFOScheduler()
    # +1: after the last epoch the trial reports the whole method scored on valid (the longest
    # setting's, where the space sweeps the epochs: see most_epochs).
    return ASHAScheduler(
        time_attr="training_iteration",
        max_t=settings.max_t or epochs + 1,
        grace_period=settings.grace_period,
        reduction_factor=settings.reduction_factor,
    )


def searcher(settings: TuneSettings, concurrent: int) -> Any:
    if settings.search == "random":
        # Random sampling, grids enumerated; seeded, so a sweep samples the same configs again.
        # Tune applies max_concurrent_trials only to the generator it builds itself, so one passed
        # in carries the limit (without it every trial started at once).
        return BasicVariantGenerator(random_state=settings.seed, max_concurrent=concurrent)
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(seed=settings.seed)


def warm_shared_stages(method: Any, base: dict[str, Any], dataset: Dataset, settings: TuneSettings) -> None:
    """Train the stages every trial shares once, here, so that trials find them in the method's cache."""
    if not settings.shared_stages:
        return
    run = run_spec(base, f"{settings.name}-shared")
    for stage in method.stages:
        if stage not in settings.shared_stages:
            break
        method.fit(stage, dataset, run)


def storage(settings: TuneSettings, base: dict[str, Any]) -> tuple[Any, Any]:
    """The sweep's Arrow filesystem (None: local) and how to write a path inside it."""
    fs = io.arrow_filesystem(settings.experiment_path, base["train"].get("storage_options") or {})
    # With an explicit filesystem Ray wants paths inside it: "bucket/prefix", no scheme.
    return fs, ((lambda p: p.split("://", 1)[1]) if fs else (lambda p: p))


def make_tuner(
    trainable: Any,
    space: dict[str, Any],
    settings: TuneSettings,
    base: dict[str, Any],
    concurrent: int,
    total: int,
    callbacks: list[Any],
    epochs: int,
    saved: list[tuple[str, str]],
) -> tune.Tuner:
    """A new Tuner, or the interrupted sweep of the same name restored (``saved``: its trials'
    states, :func:`saved_trials`)."""
    fs, inside = storage(settings, base)
    path = inside(settings.experiment_path)
    if tune.Tuner.can_restore(path, storage_filesystem=fs) and saved:
        if not settings.resume:
            raise ConfigError(
                f"tune: a sweep named {settings.name!r} exists at {path}; pass tune.resume=true to "
                "finish it, or tune.name=<new name> for a new sweep"
            )
        check_restorable(settings, base)
        # The run config (callbacks included) comes back from the sweep's saved state.
        return tune.Tuner.restore(
            path,
            trainable=trainable,
            resume_unfinished=True,
            # A finished sweep restored for its interrupted seed re-check keeps its trials as they
            # ended: a failed one run again could change the top trials the re-check trains.
            resume_errored=not finished(saved, total),
            storage_filesystem=fs,
        )
    write_fingerprint(settings, base)
    metric = settings.report_key
    progress = TrialProgress(total, metric, settings.mode)
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=metric,
            mode=settings.mode,
            num_samples=int(settings.num_samples),
            search_alg=searcher(settings, concurrent),
            scheduler=scheduler(settings, epochs),
            max_concurrent_trials=concurrent,
        ),
        run_config=tune.RunConfig(
            name=settings.name,
            storage_path=inside(settings.storage_path),
            storage_filesystem=fs,
            verbose=0,  # Tune's per-result tables; TrialProgress draws one bar instead
            callbacks=[progress, TimeBudget(), *callbacks],
        ),
    )


def tune_sweep(cfg: dict[str, Any], callbacks: list[Any] | None = None) -> dict[str, Any]:
    """Run the sweep described by ``cfg["tune"]``; returns the report written to ``tune.out``.

    ``callbacks`` are extra Ray Tune callbacks (loggers such as MLflow's, or a test's hook).
    """
    started = time.perf_counter()
    # Tune runs each trial in its own directory by default; then a relative path of the config
    # (runs/semantic-cache, runs/checkpoints) would point inside every trial's directory, and a
    # cached stage would be trained again in each. Trials keep the job's working directory, as
    # Ray Train workers do; Tune passes this setting on to its trial processes.
    os.environ.setdefault(RAY_CHDIR_TO_TRIAL_DIR, "0")
    dataset = dataset_from_config(cfg)
    method_name = (cfg.get("tune") or {}).get("entry") or cfg["method"]["name"]
    settings = tune_settings(cfg, f"{dataset.name}-{method_name}-tune")
    space = parse_space(settings.space)
    base = base_config(cfg, settings)
    method = check_space(base, space, settings)
    if base["train"].get("use_gpu") and ray.cluster_resources().get("GPU", 0) < 1:
        # Trials would start and their Ray Train runs wait for a GPU forever.
        raise ConfigError("train.use_gpu: the Ray cluster has no GPU for the trials' workers")
    expected = int(settings.num_samples) * grid_size(space)
    saved = saved_trials(settings, base)
    if settings.resume and finished(saved, expected):
        # Restoring would run its failed trials again (resume_errored) and then hand back the
        # report written before them: a finished sweep's report is returned as it is.
        check_restorable(settings, base)
        done = reported(settings, base, [t for t, _ in saved])
        if done is not None:
            print(
                f"tune: sweep {settings.name!r} was finished and reported; report unchanged", file=sys.stderr
            )
            return done
    warm_shared_stages(method, base, dataset, settings)
    trains = "train" in method.capabilities
    actor = trial_actor_resources(settings, trains)
    concurrent = max_concurrent(train_resources(base, trains, actor), settings)
    trainable = tune.with_resources(
        tune.with_parameters(
            run_trial,
            base=base,
            dataset=dataset,
            experiment=settings.name,
            shared_stages=settings.shared_stages,
            epoch_metric=settings.report_key if settings.scheduler == "asha" else None,
        ),
        actor,
    )
    epochs = most_epochs(method.config(), settings.space)
    tuner = make_tuner(
        trainable, space, settings, base, concurrent, expected, list(callbacks or []), epochs, saved
    )
    interrupted = SweepInterrupted(
        f"tune: sweep {settings.name!r} stopped before its {expected} trials"
        + (" and its seed re-check" if settings.recheck_top else "")
        + " finished; run the same command again to finish it (finished trials are kept)"
    )
    budget = settings.time_budget_s
    os.environ[BUDGET_ENV] = str(time.monotonic() + float(budget)) if budget else ""
    try:
        with releasing_orphans():  # a trial cut off as it starts can leave its workers' CPUs reserved
            results = tuner.fit()
            if not finished(saved_trials(settings, base), expected):
                # Tune returns normally after Ctrl+C (its state is saved): nothing to select from
                # yet. Not by the results' count: it counts a trial cut off while running as done.
                raise interrupted
            # (A sweep already reported was returned above, before restoring: none is reported here.)
            trials = trial_rows(results, list(space), settings.report_key, settings.mode)
            best = best_trial(results, trials, settings.mode)
            checked = None
            if settings.recheck_top:
                where = storage(settings, base)
                checked = recheck(trials, settings, base, dataset, actor, concurrent, *where)
                if checked is None:
                    raise interrupted
                best = best_trial(results, trials, settings.mode, checked[0]["trial_id"])
    finally:
        os.environ.pop(BUDGET_ENV, None)
    seconds = time.perf_counter() - started
    return write_outputs(cfg, settings, base, dataset, trials, best, sweep_seconds=seconds, recheck=checked)
