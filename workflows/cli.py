"""The ``toolscout`` command line: preprocess | train | evaluate | bench | tune | run | serve | ingest |
retrain | registry | export-adapter.

Every command reads ``configs/default.yaml``, then ``--config FILE``, then ``key=value``
overrides (dotted keys reach nested sections, e.g. ``train.num_workers=2``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from components.config import ConfigError
from workflows.cli_config import build_config, require, start_ray
from workflows.cli_guard import console, guarded
from workflows.cli_ingest import ingest_app
from workflows.cli_registry import registry_app, retrain_command

app = typer.Typer(help="toolscout: learned tool retrieval for LLM agents, on Ray.", no_args_is_help=True)
app.add_typer(ingest_app, name="ingest")
app.add_typer(registry_app, name="registry")
app.command("retrain")(guarded(retrain_command))

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]
Overrides = Annotated[list[str] | None, typer.Argument(help="key=value overrides, e.g. train.num_workers=2")]


@app.command()
@guarded
def preprocess(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    data: Annotated[str | None, typer.Option(help="Dataset dir or s3:// URL.")] = None,
    out: Annotated[str | None, typer.Option(help="Output dir or s3:// URL.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Fail on any rejected row.")] = False,
) -> None:
    """Validate a dataset with Ray Data; write parquet, graphs, rejects and a manifest."""
    cfg = build_config(
        config, overrides, data__path=data, preprocess__output=out, data__strict=strict or None
    )
    require(cfg, "data.path", "--data")
    start_ray(cfg)
    from workflows.preprocess import preprocess as run_preprocess

    manifest = run_preprocess(cfg)
    console.print(f"counts: {manifest['counts']}")
    console.print(f"rejected rows: {manifest['rejects']['total']} {manifest['rejects']['by_file']}")
    console.print(f"wrote {cfg['preprocess']['output']}")


@app.command()
@guarded
def train(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    data: Annotated[str | None, typer.Option(help="Prepared or raw dataset dir.")] = None,
    method: Annotated[str | None, typer.Option(help="Registered method name.")] = None,
) -> None:
    """Run a method's training stages and register the artifact as a new model version (MLflow)."""
    cfg = build_config(config, overrides, data__path=data, method__name=method)
    require(cfg, "data.path", "--data")
    from components.methods import method_class

    method_class(cfg["method"]["name"])  # a mistyped method fails before Ray starts
    start_ray(cfg)
    from workflows.train import train as run_train

    report = run_train(cfg)
    console.print(
        f"registered {report['model_uri']} ({report['train_seconds']:.1f}s); files: {report['artifact']}"
    )


@app.command()
@guarded
def evaluate(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    data: Annotated[str | None, typer.Option(help="Prepared or raw dataset dir.")] = None,
    artifact: Annotated[
        str | None, typer.Option(help="Artifact dir or models:/ URI (default: the newest version).")
    ] = None,
    split: Annotated[list[str] | None, typer.Option(help="Split(s); test only for final reports.")] = None,
    out: Annotated[str | None, typer.Option(help="Write the report JSON here.")] = None,
) -> None:
    """Score a saved artifact on a split."""
    cfg = build_config(config, overrides, data__path=data, evaluate__artifact=artifact, evaluate__output=out)
    if split:
        cfg["evaluate"]["splits"] = split
    require(cfg, "data.path", "--data")
    from workflows.evaluate import evaluate as run_evaluate
    from workflows.report import markdown_table

    print(markdown_table(run_evaluate(cfg)))


@app.command()
@guarded
def bench(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    data: Annotated[str | None, typer.Option(help="Prepared or raw dataset dir.")] = None,
    methods: Annotated[
        str | None, typer.Option(help="Comma-separated bench entries, e.g. bm25,bm25_lucene.")
    ] = None,
    out: Annotated[str | None, typer.Option(help="Results JSON (.md and .png beside it).")] = None,
) -> None:
    """Train each method, select settings on valid, report on test; write JSON, table and plot."""
    cfg = build_config(config, overrides, data__path=data, bench__out=out)
    if methods:
        cfg["bench"]["run"] = [m.strip() for m in methods.split(",") if m.strip()]
    require(cfg, "data.path", "--data")
    start_ray(cfg)
    from workflows.bench import bench as run_bench
    from workflows.report import markdown_table

    print(markdown_table(run_bench(cfg)))


@app.command()
@guarded
def tune(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    data: Annotated[str | None, typer.Option(help="Prepared or raw dataset dir.")] = None,
    out: Annotated[str | None, typer.Option(help="Results JSON (table, plots, best YAML beside).")] = None,
) -> None:
    """Sweep the `tune.space` keys with Ray Tune (Optuna + ASHA), select on valid, test the best once."""
    cfg = build_config(config, overrides, data__path=data, tune__out=out)
    require(cfg, "data.path", "--data")
    require(cfg, "tune.space", "tune.space=... (in the config)")
    start_ray(cfg)
    from workflows.report import markdown_table
    from workflows.tune.sweep import SweepInterrupted, tune_sweep

    try:
        report = tune_sweep(cfg)
    except SweepInterrupted as e:
        console.print(f"[yellow]{e}[/yellow]")
        raise typer.Exit(130) from e
    print(markdown_table(report))
    console.print(f"best config: {report['best_config']}")


@app.command()
@guarded
def run(config: ConfigOpt = None, overrides: Overrides = None) -> None:
    """Quickstart: generate data, preprocess, train and evaluate on a local Ray.

    Shows one progress bar per stage, then a results table; the full log goes to run.log in run.workdir.
    """
    cfg = build_config(config, overrides, base="quickstart")
    from workflows.run import quickstart
    from workflows.run_checks import check_overrides

    check_overrides(overrides, cfg)
    quickstart(cfg)  # resolves data.path first: a mistyped one fails before Ray starts


@app.command()
@guarded
def serve(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    model: Annotated[
        str | None, typer.Option(help="Artifact dir or registry URI, e.g. models:/<name>@champion.")
    ] = None,
    data: Annotated[
        str | None, typer.Option(help="Dataset dir: tool catalog and detector calibration.")
    ] = None,
    serve_config: Annotated[
        Path | None, typer.Option(help="Serve config file (default: deploy/serve_config.yaml).")
    ] = None,
    detector: Annotated[str | None, typer.Option(help="Detector calibrations JSON (read/written).")] = None,
    selector_lm: Annotated[str | None, typer.Option(help="Selector LM dir or hub name (backend lm).")] = None,
    train_selector: Annotated[
        str | None, typer.Option(help="Train the selector LM on --data into this dir, then serve it.")
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="HTTP host (default from the config, else 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default from the config, else 8000).")] = None,
    calibrate_only: Annotated[bool, typer.Option("--calibrate-only", help="Calibrate, then exit.")] = False,
) -> None:
    """Serve detection -> retrieval -> selection on Ray Serve (``serve.*`` overrides reach the app args)."""
    from workflows.serve import app_args, lm_selector, prepare, read_serve_config, run_server
    from workflows.serve import train_selector as fit_selector

    cfg = build_config(config, [o for o in overrides or [] if not o.startswith("serve.")], data__path=data)
    file = read_serve_config(serve_config)
    flags = {"artifact": model, "detector_file": detector}
    if data:
        flags |= {"catalog": data, "calibration_data": data}
    args = app_args(file, flags, overrides or [])
    if selector_lm:  # the file's section keeps its deployment settings (deadline_s)
        args["selector"] = lm_selector(args.get("selector"), selector_lm)
    if not train_selector and args.pop("selector_training", None) is not None:
        print("args.selector_training is read with --train-selector only: not used")
    from components.registry import RegistrySettings

    # Where models:/ URIs resolve: the serve config file's args.registry (the quickstart's store by
    # default), unless this command names a config or registry.* overrides. Absolute, since Serve's
    # build task resolves them too, in another working directory.
    if config or any(o.startswith("registry.") for o in overrides or []) or "registry" not in args:
        args["registry"] = RegistrySettings.from_config(cfg.get("registry")).as_config()
    if not args.get("artifact"):
        raise ConfigError("no artifact to serve: pass --model or set args.artifact in the serve config")
    data_path = cfg["data"].get("path") or args.get("calibration_data")
    args = prepare(args, data_path, cfg.get("splits"))
    if calibrate_only:
        return
    if train_selector:
        require(cfg, "data.path", "--data")
    http = file.get("http_options") or {}
    from components.serving.deploy import apply_serve_env

    apply_serve_env()  # before Ray starts: a local Ray's Serve processes inherit it
    start_ray(cfg)
    if train_selector:  # a Ray Train stage on the config's train section, like every training
        from workflows.train import new_run

        args = fit_selector(args, data_path, train_selector, cfg.get("splits"), new_run(cfg, "selector"))
    run_server(args, host or http.get("host", "127.0.0.1"), port or int(http.get("port", 8000)), file)


@app.command("export-adapter")
@guarded
def export_adapter(
    artifact: Annotated[str, typer.Argument(help="A query-generation artifact: a dir or models:/ URI.")],
    dest: Annotated[str, typer.Argument(help="Where it goes: <lora_dir>/<name> (s3://... or a dir).")],
    config: ConfigOpt = None,
    overrides: Overrides = None,
) -> None:
    """Write a trained rewriter's generator as one LoRA adapter over its base LM, for Ray Serve
    LLM's adapter multiplexing (request model ``<model_id>:<name>``)."""
    from components.methods.querygen.adapter import export_generator_adapter
    from components.registry import resolve

    cfg = build_config(config, overrides)
    report = export_generator_adapter(resolve(artifact, cfg.get("registry")), dest)
    console.print(
        f"{dest}: rank {report.rank}, {report.modules} projections, "
        f"max relative residual {report.max_residual:.1e}"
    )


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    sys.exit(main())
