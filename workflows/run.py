"""``toolscout run``: the quickstart. Generated data -> preprocess -> train -> evaluate, locally.

:func:`quickstart` is the command: one progress bar per stage, a table of results at the end, and
everything else (Ray, Hugging Face, every library's log records) in ``<workdir>/run.log``.
:func:`run` is the pipeline alone, for callers that handle output themselves.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from components.config import ConfigError, as_list, merge
from components.data import io
from components.data.prepared import is_prepared, read_manifest
from components.data.quickstart import QUICKSTART_VERSION, generate_quickstart
from workflows.evaluate import evaluate, remove_old_output, write_output
from workflows.preprocess import preprocess
from workflows.quiet import Stage, logged_stage, quiet_output, stage_bars
from workflows.ray_env import init_ray, logs_dir
from workflows.report import write_report
from workflows.run_checks import method_params, resolve_artifacts, run_methods
from workflows.train import train

log = logging.getLogger("toolscout.run")
LOG_NAME = "run.log"
GENERATED_WITH = "quickstart.json"  # in a generated data dir: the settings it was generated with
# Columns of the closing table; the full set is in results.md and results.json.
TABLE_COLUMNS = ("recall@3", "ndcg@3", "recall@5", "comp@3", "detect_auroc")


def quickstart_data(cfg: dict[str, Any]) -> str:
    """The dataset directory to run on: ``data.path`` if set, else generated under the workdir.

    ``data.path`` may be a raw dataset (``corpus.jsonl`` and the rest) or a directory that
    ``toolscout preprocess`` wrote (its ``manifest.json``), local or ``s3://`` with
    ``data.storage_options``.

    Raises:
        FileNotFoundError: ``data.path`` is set but is neither.
    """
    rcfg = cfg["run"]
    work = os.path.abspath(rcfg["workdir"])
    given = cfg["data"].get("path")
    data_dir = given or os.path.join(work, "data")
    options = cfg["data"].get("storage_options")
    if given and not (io.exists(io.join(given, "corpus.jsonl"), options) or is_prepared(given, options)):
        # A mistyped path must not turn into a run on generated data reported as the user's.
        raise FileNotFoundError(
            f"data.path {given!r} has no corpus.jsonl and is no prepared directory (no manifest.json); "
            "leave data.path unset for quickstart data"
        )
    if given:
        return data_dir
    settings = {
        "seed": int(rcfg.get("seed", 0)),
        "n_queries": int(rcfg["n_queries"]),
        "n_neg": int(rcfg["n_neg"]),
        "wording": str(rcfg.get("wording", "held_out")),
    }
    # Data generated before with other settings, or by another generator version, is replaced.
    marker = os.path.join(data_dir, GENERATED_WITH)
    wanted = {**settings, "version": QUICKSTART_VERSION}
    if not os.path.exists(marker) or json.loads(Path(marker).read_text()) != wanted:
        # The old marker goes first: data half-written by an interrupted run must not pass for it.
        Path(marker).unlink(missing_ok=True)
        counts = generate_quickstart(data_dir, **settings)
        Path(marker).write_text(json.dumps(wanted, sort_keys=True) + "\n")
        log.info("generated quickstart data in %s: %s", data_dir, counts)
    return data_dir


def run(cfg: dict[str, Any], data_dir: str | None = None, stage: Stage = logged_stage) -> dict[str, Any]:
    """Run the whole pipeline under ``cfg["run"]["workdir"]``; returns the evaluation report.

    Trains every method in ``run.methods`` (BM25 indexes; dense and MassTool run Ray Train
    stages) and evaluates each on ``evaluate.splits``. A method's ``run.params`` may name the
    artifact of one trained before it as ``{artifact:NAME}``. ``results.json`` (with ``.md`` and
    ``.png``) is rewritten after each method, so a run that fails part-way keeps what it scored;
    ``evaluate.output``, if set, gets the whole report at the end.

    Args:
        data_dir: What :func:`quickstart_data` returned, if the caller already resolved it.
        stage: Marks the stages (preprocessing; training and evaluating each method).

    Raises:
        ConfigError: ``evaluate.splits`` names a split the data does not have (before any training).
    """
    rcfg = cfg["run"]
    work = os.path.abspath(rcfg["workdir"])
    data_dir = data_dir or quickstart_data(cfg)
    options = cfg["data"].get("storage_options")
    results = os.path.join(work, "results.json")
    for stale in (results, *(os.path.splitext(results)[0] + ext for ext in (".md", ".png"))):
        Path(stale).unlink(missing_ok=True)  # an earlier run's results must not pass for this one's
    remove_old_output(cfg)
    cfg = merge(
        cfg,
        {
            "data": {"path": data_dir},
            "preprocess": {"output": os.path.join(work, "prepared")},
            "registry": {"root": os.path.join(work, "registry")},
            "train": {
                "storage_path": os.path.join(work, "train"),
                "local_dir": os.path.join(work, "checkpoints"),
            },
        },
    )
    if is_prepared(data_dir, options):
        manifest = read_manifest(data_dir, options)
        log.info("data.path %s is a prepared directory: nothing to preprocess", data_dir)
    else:
        with stage("preprocess (Ray Data)") as step:
            manifest = preprocess(cfg)
            step()
        log.info(
            "preprocessed: %s, rejects: %s -> %s",
            manifest["counts"],
            manifest["rejects"]["total"],
            cfg["preprocess"]["output"],
        )
        cfg = merge(cfg, {"data": {"path": cfg["preprocess"]["output"]}})
    splits = [str(s) for s in as_list(cfg["evaluate"].get("splits", ["valid"]), "evaluate.splits")]
    unknown = sorted(set(splits) - set(manifest.get("splits", splits)))
    if unknown:
        raise ConfigError(f"evaluate.splits: {unknown} not in the data's splits {manifest['splits']}")
    rows, artifacts = [], {}
    report: dict[str, Any] = {"dataset": manifest["dataset"], "results": rows}
    for name in run_methods(cfg):
        params = resolve_artifacts(method_params(cfg, name), artifacts)
        # Replace (not merge) the method section: each method has its own parameters.
        mcfg = {**cfg, "method": {"name": name, "params": params}}
        mcfg = merge(mcfg, {"registry": {"model_name": f"quickstart-{name}"}})
        with stage(f"{name}: train, evaluate", 2) as step:
            trained = train(mcfg, promote=True)  # a rerun's models are the ones @champion serves
            artifacts[name] = trained["artifact"]
            log.info(
                "trained %s in %.1fs: %s", name, trained["train_seconds"], json.dumps(trained, default=str)
            )
            step()
            # One report for the whole run (below), not one per method over the same file.
            only = {"evaluate": {"artifact": trained["artifact"], "output": None}}
            scored = evaluate(merge(mcfg, only))["results"]
            log.info("evaluated %s: %s", name, json.dumps(scored, default=str))
            rows += scored
            write_report(report, results, title="toolscout quickstart")
            step()
    write_output(cfg, report)
    return report


def results_table(report: dict[str, Any], columns: tuple[str, ...] = TABLE_COLUMNS) -> Table:
    """One row per (method, split); the best value of each column within a split in bold."""
    rows = report["results"]
    present = [c for c in columns if any(c in r["metrics"] for r in rows)]
    best = {
        (split, c): max(r["metrics"].get(c, float("-inf")) for r in rows if r["split"] == split)
        for split in {r["split"] for r in rows}
        for c in present
    }
    table = Table(title="toolscout quickstart", title_style="bold", box=box.SIMPLE_HEAD)
    for head in ("method", "split", *present):
        table.add_column(head, justify="left" if head in ("method", "split") else "right")
    for r in rows:
        cells = []
        for c in present:
            value = r["metrics"].get(c)
            text = "" if value is None else f"{value:.3f}"
            cells.append(f"[bold]{text}[/]" if value is not None and value == best[(r["split"], c)] else text)
        table.add_row(r["method"], r["split"], *cells)
    return table


def quickstart(cfg: dict[str, Any]) -> dict[str, Any]:
    """``toolscout run``: :func:`run` on a local Ray, quietly; returns the evaluation report.

    The terminal shows one bar per stage and the results table; the rest goes to
    ``<workdir>/run.log``, which the last line names. A mistyped ``data.path`` fails before Ray starts.
    """
    work = os.path.abspath(cfg["run"]["workdir"])
    log_path = os.path.join(work, LOG_NAME)
    with quiet_output(log_path) as console, stage_bars(console) as stage:
        with stage("quickstart data") as step:
            data_dir = quickstart_data(cfg)
            step()
        with stage("start Ray") as step:
            init_ray({**(cfg.get("ray") or {}), "progress_bars": False})
            log.info("Ray's own logs (workers, Train, Data): %s", logs_dir())
            step()
        report = run(cfg, data_dir, stage)
    lines = [f"results: {os.path.join(work, 'results.json')} (and results.md, results.png)"]
    if not cfg["data"].get("path") and cfg["run"].get("wording", "held_out") == "held_out":
        # Tool queries only: no-tool queries are split by the loader (by text hash) after they are
        # written, so they share the training wording; detection figures carry that cue.
        lines.insert(
            0, "valid and test tool queries are worded unlike any training query (no-tool ones are not)"
        )
    out = Console()
    out.print(results_table(report))
    out.print("\n".join([*lines, f"full log: {log_path}"]))
    return report
