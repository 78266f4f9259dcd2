"""``toolscout run``: the quickstart. Generated data -> preprocess -> train -> evaluate, locally.

:func:`quickstart` is the command: one progress bar per stage, a table of results at the end, and
everything else (Ray, Hugging Face, every library's log records) in ``<workdir>/run.log``.
:func:`run` is the pipeline alone, for callers that handle output themselves.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from components.config import ConfigError, as_list, merge
from components.data import io
from components.data.quickstart import QUICKSTART_VERSION, generate_quickstart
from workflows.evaluate import evaluate
from workflows.preprocess import preprocess
from workflows.quiet import Stage, logged_stage, quiet_output, stage_bars
from workflows.ray_env import init_ray, logs_dir
from workflows.report import write_report
from workflows.train import train

log = logging.getLogger("toolscout.run")
LOG_NAME = "run.log"
GENERATED_WITH = "quickstart.json"  # in a generated data dir: the settings it was generated with
ARTIFACT_REF = re.compile(r"\{artifact:(\w+)\}")  # in run.params: a method trained earlier in the run
# Columns of the closing table; the full set is in results.md and results.json.
TABLE_COLUMNS = ("recall@3", "ndcg@3", "recall@5", "comp@3", "detect_auroc")


def quickstart_data(cfg: dict[str, Any]) -> str:
    """The dataset directory to run on: ``data.path`` if set, else generated under the workdir.

    Raises:
        FileNotFoundError: ``data.path`` is set but holds no ``corpus.jsonl``.
    """
    rcfg = cfg["run"]
    work = os.path.abspath(rcfg["workdir"])
    given = cfg["data"].get("path")
    data_dir = given or os.path.join(work, "data")
    if given and not io.exists(io.join(given, "corpus.jsonl")):
        # A mistyped path must not turn into a run on generated data reported as the user's.
        raise FileNotFoundError(
            f"data.path {given!r} has no corpus.jsonl; leave data.path unset for quickstart data"
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


# Settings `toolscout run` sets itself, under run.workdir: an override of one would be dropped.
WORKDIR_KEYS = ("registry.root", "train.storage_path", "train.local_dir", "preprocess.output")


def check_overrides(overrides: list[str] | None, cfg: dict[str, Any]) -> None:
    """Refuse command-line overrides the quickstart would silently ignore.

    Raises:
        ConfigError: a ``method.*`` key while ``run.methods`` lists the methods (their params come
            from ``run.params``), or a path ``run.workdir`` decides.
    """
    listed = cfg["run"].get("methods")
    for item in overrides or []:
        key = item.partition("=")[0].strip()
        if key.startswith("method.") and listed:
            raise ConfigError(
                f"toolscout run: {key} is not used while run.methods lists the methods ({listed}); "
                "give a method's params as run.params.<method>.<param>, e.g. run.params.dense.epochs=1"
            )
        if any(key == k or key.startswith(k + ".") for k in WORKDIR_KEYS):
            raise ConfigError(f"toolscout run: {key} is set under run.workdir; set run.workdir instead")
    from workflows.cli_config import packaged_config

    shipped = merge(packaged_config("default"), packaged_config("quickstart"))
    if listed and cfg["method"] != shipped["method"]:  # a config file's method section (train's)
        raise ConfigError(
            f"toolscout run: the config's method section ({cfg['method'].get('name')!r}) is not used "
            f"while run.methods lists the methods ({listed}); set run.methods and run.params instead"
        )
    # Before any data is generated or Ray started: a misspelt method, params for a method not run
    # (`run.params.desne.epochs=1`, never read) or an artifact reference to a later method.
    from components.methods import method_class

    names = [str(n) for n in as_list(listed or [cfg["method"]["name"]], "run.methods")]
    for name in names:
        try:
            method_class(name)
        except (KeyError, ValueError) as e:
            raise ConfigError(f"toolscout run: run.methods: {e}") from None
    # The shipped params of a method left out of run.methods are simply unused; any other is a typo.
    stray = sorted(set(cfg["run"].get("params") or {}) - set(names) - set(shipped["run"]["params"]))
    if stray:
        raise ConfigError(f"toolscout run: run.params has {stray}, which run.methods ({names}) does not run")
    for i, name in enumerate(names):
        earlier = dict.fromkeys(names[:i], "")
        try:
            resolve_artifacts((cfg["run"].get("params") or {}).get(name, {}), earlier)
        except ValueError as e:
            raise ConfigError(f"toolscout run: run.params.{name}: {e}") from None


def resolve_artifacts(params: Any, artifacts: dict[str, str]) -> Any:
    """``params`` with each ``{artifact:NAME}`` in a string replaced by the artifact dir of NAME.

    Raises:
        ValueError: NAME is not among ``artifacts`` (the methods trained earlier in the run).
    """
    if isinstance(params, dict):
        return {k: resolve_artifacts(v, artifacts) for k, v in params.items()}
    if isinstance(params, list):
        return [resolve_artifacts(v, artifacts) for v in params]
    if not isinstance(params, str):
        return params
    for name in ARTIFACT_REF.findall(params):
        if name not in artifacts:
            raise ValueError(f"{params!r} names {name!r}, which run.methods does not train before it")
    return ARTIFACT_REF.sub(lambda m: artifacts[m.group(1)], params)


def run(cfg: dict[str, Any], data_dir: str | None = None, stage: Stage = logged_stage) -> dict[str, Any]:
    """Run the whole pipeline under ``cfg["run"]["workdir"]``; returns the evaluation report.

    Trains every method in ``run.methods`` (BM25 indexes; dense and MassTool run Ray Train
    stages) and evaluates each on ``evaluate.splits``. A method's ``run.params`` may name the
    artifact of one trained before it as ``{artifact:NAME}``.

    Args:
        data_dir: What :func:`quickstart_data` returned, if the caller already resolved it.
        stage: Marks the stages (preprocessing; training and evaluating each method).
    """
    rcfg = cfg["run"]
    work = os.path.abspath(rcfg["workdir"])
    data_dir = data_dir or quickstart_data(cfg)
    prepared = os.path.join(work, "prepared")
    cfg = merge(
        cfg,
        {
            "data": {"path": data_dir},
            "preprocess": {"output": prepared},
            "registry": {"root": os.path.join(work, "registry")},
            "train": {
                "storage_path": os.path.join(work, "train"),
                "local_dir": os.path.join(work, "checkpoints"),
            },
        },
    )
    with stage("preprocess (Ray Data)") as step:
        manifest = preprocess(cfg)
        step()
    log.info(
        "preprocessed: %s, rejects: %s -> %s", manifest["counts"], manifest["rejects"]["total"], prepared
    )
    cfg = merge(cfg, {"data": {"path": prepared}})
    rows, artifacts = [], {}
    for name in as_list(rcfg.get("methods") or [cfg["method"]["name"]], "run.methods"):
        params = resolve_artifacts((rcfg.get("params") or {}).get(name, {}), artifacts)
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
            scored = evaluate(merge(mcfg, {"evaluate": {"artifact": trained["artifact"]}}))["results"]
            log.info("evaluated %s: %s", name, json.dumps(scored, default=str))
            rows += scored
            step()
    report = {"dataset": manifest["dataset"], "results": rows}
    write_report(report, os.path.join(work, "results.json"), title="toolscout quickstart")
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
        lines.insert(0, "valid and test queries are worded unlike any training query")
    out = Console()
    out.print(results_table(report))
    out.print("\n".join([*lines, f"full log: {log_path}"]))
    return report
