"""What a sweep leaves behind: every trial's row, the best config as YAML, one test evaluation of
it (the only time the sweep reads test), a table and plots."""

from __future__ import annotations

import copy
import io as io_bytes
import json
import math
import os
from typing import Any

import yaml

from components import methods
from components.data import Dataset, io
from workflows.bench import bench_entry, split_rows
from workflows.report import markdown_table, md_table, strict_json, write_report
from workflows.tune.recheck import recheck_table
from workflows.tune.settings import TuneSettings
from workflows.tune.space import apply_params
from workflows.tune.trainable import FINAL


def trial_rows(results: Any, keys: list[str], metric: str, mode: str) -> list[dict[str, Any]]:
    """One row per trial: its parameters, valid metric, status, epochs reported and seconds.

    ``status`` is ``completed`` (trained to the end and scored as a whole on valid: ``valid`` is
    that score), ``stopped`` (the scheduler stopped it: ``valid`` is its best epoch report) or
    ``error``.
    """
    rows = []
    for result in results:
        metrics = result.metrics or {}
        frame = result.metrics_dataframe
        epochs = [] if frame is None or metric not in frame else [float(v) for v in frame[metric].dropna()]
        if result.error is not None:
            status, value = "error", None
        elif metrics.get(FINAL) == 1.0:
            status, value = "completed", float(metrics[metric])
        else:
            status = "stopped"
            value = (max(epochs) if mode == "max" else min(epochs)) if epochs else None
        rows.append(
            {
                "trial_id": metrics.get("trial_id") or os.path.basename(str(result.path)),
                "params": {k: result.config.get(k) for k in keys},
                "valid": value,
                "status": status,
                "epochs_reported": len(epochs) - (status == "completed"),
                "seconds": float(metrics.get("time_total_s", 0.0)),
                "finished_at": float(metrics.get("timestamp", 0.0)),
            }
        )
    rows.sort(key=lambda r: r["finished_at"])
    return rows


def best_trial(
    results: Any, rows: list[dict[str, Any]], mode: str, trial_id: str | None = None
) -> tuple[dict[str, Any], Any]:
    """The completed trial with the best valid score (or the one named ``trial_id``, as the seed
    re-check selects it), and its Tune result."""
    done = [r for r in rows if r["status"] == "completed"]
    if not done:
        statuses = [r["status"] for r in rows]
        raise RuntimeError(f"tune: no trial completed ({statuses}); see the trials' errors")
    if trial_id is None:
        row = (max if mode == "max" else min)(done, key=lambda r: r["valid"])
    else:
        row = next(r for r in done if r["trial_id"] == trial_id)
    for result in results:
        if (result.metrics or {}).get("trial_id") == row["trial_id"]:
            return row, result
    raise RuntimeError(f"tune: trial {row['trial_id']} has no result")


def best_config(
    cfg: dict[str, Any], base: dict[str, Any], params: dict[str, Any], label: str
) -> dict[str, Any]:
    """A config ``toolscout train`` and ``toolscout bench`` take unchanged: the sweep's data, splits
    and training settings with the selected values, as the ``method`` and as one bench entry."""
    # The method the trials trained, as a whole: merged into the config's own ``method`` section,
    # a key only that section sets (a bench entry was swept) would reach the YAML untrained.
    chosen = apply_params({**cfg, "method": copy.deepcopy(base["method"])}, params)
    method = chosen["method"]
    out = {key: chosen[key] for key in ("data", "splits", "train") if key in chosen}
    out["method"] = method
    out["bench"] = {
        "run": [label],
        "methods": {label: {"method": method["name"], "params": copy.deepcopy(method.get("params") or {})}},
    }
    return out


def trials_plot(
    rows: list[dict[str, Any]],
    keys: list[str],
    metric: str,
    mode: str,
    path: str,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """The valid metric against each swept parameter, and the best-so-far curve in finishing order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [r for r in rows if r["valid"] is not None]
    fig, axes = plt.subplots(1, len(keys) + 1, figsize=(3.2 * (len(keys) + 1), 3.2), squeeze=False)
    colours = {"completed": "tab:blue", "stopped": "tab:orange"}
    for ax, key in zip(axes[0], keys, strict=False):
        values = [r["params"][key] for r in scored]
        numeric = all(isinstance(v, (int, float)) for v in values)
        xs = values if numeric else [str(v) for v in values]
        ax.scatter(xs, [r["valid"] for r in scored], c=[colours.get(r["status"], "k") for r in scored], s=18)
        if numeric and values and min(values) > 0 and max(values) / min(values) > 20:
            ax.set_xscale("log")
        elif numeric and values and min(values) == 0 and max(values) > 0:
            # A grid such as lambda in {0, 0.01, ..., 10}: log-like above the smallest non-zero
            # value, linear through 0, so the small settings do not pile up at the origin.
            ax.set_xscale("symlog", linthresh=min(v for v in values if v > 0))
        ax.set_xlabel(key.split(".")[-1])
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    best, curve = None, []
    for r in rows:
        if r["status"] == "completed":
            best = r["valid"] if best is None else (max if mode == "max" else min)(best, r["valid"])
        curve.append(math.nan if best is None else best)
    ax = axes[0][-1]
    ax.plot(range(1, len(curve) + 1), curve, marker="o")
    ax.set_xlabel("trials finished")
    ax.set_ylabel(f"best {metric} so far")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io_bytes.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    io.write_bytes(path, buffer.getvalue(), storage_options)


def trials_table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    body = [
        [
            r["trial_id"],
            *(cell(r["params"][k]) for k in keys),
            "" if r["valid"] is None else cell(r["valid"]),
            r["status"],
            str(r["epochs_reported"]),
            f"{r['seconds']:.0f}",
        ]
        for r in rows
    ]
    head = ["trial", *(k.split(".")[-1] for k in keys), "valid", "status", "epochs", "seconds"]
    return "\n".join(md_table(head, body)) + "\n"


def reported(settings: TuneSettings, base: dict[str, Any], trial_ids: list[str]) -> dict | None:
    """The report a finished sweep already wrote for these trials, if there is one: the same
    command run again restores the finished sweep, and scoring its best trial again would read
    test a second time (and retrain the baseline, whose test figure may then move)."""
    options = base["train"].get("storage_options") or {}
    # The sweep's own copy first: tune.out may hold another sweep's report by now (a wider sweep
    # of the same config writes the same file), and this one's test must not be read again.
    for path in dict.fromkeys([own_report(settings), settings.out or own_report(settings)]):
        if io.exists(path, options):
            saved = json.loads(io.read_bytes(path, options))
            if sorted(t["trial_id"] for t in saved.get("trials") or []) == sorted(trial_ids):
                return saved
    return None


def own_report(settings: TuneSettings) -> str:
    """Where a sweep keeps its report beside its trials: ``tune.out`` when that is not set, else a
    copy of it there."""
    return io.join(settings.experiment_path, "results.json")


def write_outputs(
    cfg: dict[str, Any],
    settings: TuneSettings,
    base: dict[str, Any],
    dataset: Dataset,
    trials: list[dict[str, Any]],
    best: tuple[dict[str, Any], Any],
    sweep_seconds: float,
    recheck: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Score the best trial's artifact on valid and test, train the baseline entry if any, and
    write the JSON, markdown, plots and ``_best.yaml``. ``recheck``: the seed re-check's rows, best
    mean first (:func:`workflows.tune.recheck.summarise`), when the best was selected by it."""
    row, result = best
    keys = list(settings.space)
    label = f"{settings.entry or base['method']['name']}_tuned"
    baseline = []
    if settings.baseline:
        # Trained before the best trial's test reading: a run stopped while the baseline trains
        # has read no test, and its rerun reads it once (the report is written right after).
        entries = (cfg.get("bench") or {}).get("methods") or {}
        baseline = bench_entry(settings.baseline, entries[settings.baseline], dataset, cfg)
    with result.checkpoint.as_directory() as path:
        method = methods.load(path)
    results = split_rows(method, dataset, label)  # the sweep's one reading of test
    for r in results:
        r["train_seconds"] = float(result.metrics.get("train_seconds", 0.0))
    results += baseline
    out = settings.out or own_report(settings)
    # The outputs live where the trials do (or at tune.out), reached with the same options.
    options = base["train"].get("storage_options") or {}
    stem = os.path.splitext(out)[0]
    chosen = best_config(cfg, base, row["params"], label)
    by = f"{settings.metric} = {row['valid']:.4f}"
    if recheck:
        seeds = len(recheck[0]["valid_runs"])
        by = f"mean {settings.metric} = {recheck[0]['valid_mean']:.4f} over {seeds} seeds"
    header = (
        f"# Selected by `toolscout tune` ({settings.name}): trial {row['trial_id']},"
        f" {by} of {len(trials)} trials.\n"
    )
    io.write_bytes(stem + "_best.yaml", (header + yaml.safe_dump(chosen, sort_keys=False)).encode(), options)
    report = {
        "dataset": dataset.name,
        "metric": settings.metric,
        "mode": settings.mode,
        "search": settings.search,
        "scheduler": settings.scheduler,
        "space": settings.space,
        "num_samples": settings.num_samples,
        "best": {"trial_id": row["trial_id"], "params": row["params"], "valid": row["valid"]},
        "best_config": stem + "_best.yaml",
        "results": results,
        "trials": trials,
        "sweep_seconds": sweep_seconds,
    }
    if recheck:
        report["recheck"] = recheck
        report["best"]["valid_mean"] = recheck[0]["valid_mean"]
    counts = {s: sum(r["status"] == s for r in trials) for s in ("completed", "stopped", "error")}
    chosen_text = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in row["params"].items())
    notes = (
        f"{len(trials)} trials ({counts['completed']} completed, {counts['stopped']} stopped by"
        f" {settings.scheduler}, {counts['error']} failed), {settings.search} search on"
        f" {settings.metric}, {sweep_seconds / 60:.1f} min in all"
        + (
            f" with the seed re-check of the top {len(recheck)} ({settings.recheck_seeds} more seeds each;"
            " selected on the mean)"
            if recheck
            else ""
        )
        + f". Best trial {row['trial_id']}:"
        f" {chosen_text}; its config is"
        f" `{os.path.basename(stem)}_best.yaml`. Test is read once, for that trial"
        + (f" and for the hand-picked `{settings.baseline}` (this run)." if settings.baseline else ".")
        + "\n"
    )
    report["notes"] = notes
    table = markdown_table(report) + "\n## Trials (finishing order)\n\n" + trials_table(trials, keys)
    if recheck:
        table += "\n## Seed re-check (best mean first)\n\n" + recheck_table(recheck, keys)
    write_report(
        report, out, title=settings.title or f"Tune: {settings.name}", table=table, storage_options=options
    )
    if out != own_report(settings):
        io.write_bytes(own_report(settings), strict_json(report), options)
    trials_plot(trials, keys, settings.metric, settings.mode, stem + "_trials.png", options)
    return report
