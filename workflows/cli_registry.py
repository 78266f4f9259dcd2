"""``toolscout registry`` (server | list | promote | rollback) and ``toolscout retrain``."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlsplit

import typer

from workflows.cli_guard import console, guarded

if TYPE_CHECKING:
    from components.registry import ModelRegistry

registry_app = typer.Typer(
    help="The model registry (MLflow): versions, aliases, the tracking server.", no_args_is_help=True
)

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config file (its registry section).")
]
Overrides = Annotated[
    list[str] | None, typer.Argument(help="key=value overrides, e.g. registry.root=/data/registry")
]
Follow = Annotated[
    str | None,
    typer.Option(help="Ray address of a cluster running the Serve app: swap it to the new champion."),
]


ModelName = Annotated[str, typer.Argument(help="Registered model name, e.g. quickstart-bm25.")]


def _registry(config: Path | None, overrides: list[str] | None, new: bool = False) -> ModelRegistry:
    """The registry the config's ``registry`` section names, which must exist unless ``new`` (a
    server may start on an empty store): the embedded store
    was created wherever a command ran, so ``registry list`` in another directory reported a new,
    empty registry ("no versions") instead of saying there was none there."""
    from components.registry import ModelRegistry, RegistrySettings
    from workflows.cli_config import build_config

    settings = RegistrySettings.from_config(build_config(config, overrides).get("registry"))
    if settings.embedded and not new and not os.path.exists(settings.sqlite_path):
        raise LookupError(
            f"no registry at {settings.root} ({settings.sqlite_path} does not exist): run from the "
            "directory that trained the models, or set registry.root=<its runs/registry>"
        )
    return ModelRegistry(settings)


def _follow(address: str | None, name: str) -> None:
    """Connect to the cluster at ``address`` and swap its Serve app to ``models:/<name>@champion``."""
    if not address:
        return
    import ray

    from components.serving.swap import SwapFailed, follow_model

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        pinned = follow_model(f"models:/{name}@champion")
    except SwapFailed as e:  # the alias moved; serving did not follow it
        console.print(f"[bold red]error:[/] the champion moved, but serving did not follow: {e}")
        raise typer.Exit(1) from e
    console.print(f"serving follows the champion: {pinned}")


@registry_app.command("server")
@guarded
def server(
    config: ConfigOpt = None,
    overrides: Overrides = None,
    host: Annotated[str, typer.Option(help="Bind address (0.0.0.0 inside a pod).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 5000,
    workers: Annotated[int, typer.Option(help="Server processes (MLflow's default is 4).")] = 1,
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            help="Host headers the server answers, comma-separated (e.g. 'toolscout-mlflow,"
            "toolscout-mlflow:*'); MLflow's default answers only localhost and private IPs, "
            "and refuses a service name with 403."
        ),
    ] = None,
) -> None:
    """Run an MLflow tracking server over the config's registry store (``mlflow server``).

    One process by default: a registry sees a few requests per training run, and each of
    MLflow's default four workers imports all of MLflow.
    """
    reg = _registry(config, overrides, new=True)
    s = reg.settings
    if s.resolved_uri.split("://", 1)[0] in ("http", "https"):
        # MLFLOW_TRACKING_URI set for clients (a pod's environment) names a server, not a store:
        # mlflow would start and fail on its first request.
        raise ValueError(
            f"the registry server needs a database as its store, not another server: the tracking "
            f"URI is {s.resolved_uri} (from registry.tracking_uri or MLFLOW_TRACKING_URI); set "
            "registry.tracking_uri to sqlite:///..., postgresql://... or mysql://..., or unset "
            "MLFLOW_TRACKING_URI to serve the embedded store under registry.root"
        )
    artifacts = s.artifact_root or os.path.abspath(os.path.join(s.root, "artifacts"))
    argv = [
        "mlflow", "server", "--backend-store-uri", s.resolved_uri, "--artifacts-destination", artifacts,
        "--serve-artifacts", "--host", host, "--port", str(port), "--workers", str(workers),
    ]  # fmt: skip
    if allowed_hosts:
        argv += ["--allowed-hosts", allowed_hosts]
    models = {m.name for m in reg.client.search_registered_models()}  # experiments are named after them
    local = sorted(
        e.name
        for e in reg.client.search_experiments()
        # A path or file: URI; not mlflow-artifacts:/ (proxied by the server) nor s3:// and the like.
        if e.name in models and urlsplit(e.artifact_location).scheme in ("", "file")
    )
    if local:
        # Logged by the embedded store before the server ran: their files are read by path, which
        # only processes on this machine can do; the server proxies only what it stores itself.
        console.print(
            f"[yellow]warning:[/] {', '.join(local)}: versions logged before this server keep their "
            "files at local paths, readable by clients on this machine only; clients elsewhere need "
            "those versions logged again through the server"
        )
    console.print("running: " + " ".join(argv))
    exe = shutil.which("mlflow") or os.path.join(os.path.dirname(sys.executable), "mlflow")
    os.execv(exe, argv)


@registry_app.command("list")
@guarded
def list_versions(
    name: ModelName,
    config: ConfigOpt = None,
    overrides: Overrides = None,
) -> None:
    """Every version of a model with its aliases, decision tag and metrics (JSON lines)."""
    reg = _registry(config, overrides)
    versions = reg.versions(name)
    if not versions:
        raise LookupError(f"model {name!r} has no versions in {reg.settings.resolved_uri}")
    for v in versions:
        row = {"version": v.number, "aliases": list(v.aliases), "decision": v.tags.get("toolscout.decision")}
        print(json.dumps({**row, "metrics": v.metrics}))


@registry_app.command("promote")
@guarded
def promote(
    name: ModelName,
    version: Annotated[
        int, typer.Argument(help="The version to make champion (no gate: an operator's call).")
    ],
    config: ConfigOpt = None,
    overrides: Overrides = None,
    follow: Follow = None,
) -> None:
    """Make a version the champion by hand; the old champion becomes ``previous``."""
    reg = _registry(config, overrides)
    reg.promote(name, version)
    console.print(f"{name}: champion -> v{version}; aliases {reg.aliases(name)}")
    _follow(follow, name)


@registry_app.command("rollback")
@guarded
def rollback(
    name: ModelName,
    config: ConfigOpt = None,
    overrides: Overrides = None,
    follow: Follow = None,
) -> None:
    """Move the champion back to ``previous`` (a second rollback undoes the first)."""
    reg = _registry(config, overrides)
    champion = reg.rollback(name)
    console.print(f"{name}: champion -> v{champion.number}; aliases {reg.aliases(name)}")
    _follow(follow, name)


def retrain_command(
    increment: Annotated[str, typer.Option("--increment", help="Increment dir or s3:// URL (BEIR layout).")],
    config: ConfigOpt = None,
    overrides: Overrides = None,
    data: Annotated[str | None, typer.Option(help="Base dataset dir or s3:// URL (raw BEIR).")] = None,
    out: Annotated[str | None, typer.Option(help="Where the decision, rejects and merged data go.")] = None,
) -> None:
    """Merge an increment, train a challenger and promote it only if it beats the champion."""
    from workflows.cli_config import build_config, require, start_ray
    from workflows.retrain.job import retrain

    cfg = build_config(config, overrides, data__path=data, retrain__out=out)
    require(cfg, "data.path", "--data")
    start_ray(cfg)
    record = retrain(cfg, increment)
    interval = record["interval"]
    shown = f" [{interval['low']:+.4f}, {interval['high']:+.4f}]" if interval else ""
    console.print(
        f"{record['model']}: challenger v{record['challenger']['version']} {record['decision']}{shown}; "
        f"rejects {record['increment']['rejects']}; aliases {record['aliases']}"
    )
    for reason in record["reasons"]:
        console.print(f"  {reason}")
    print(json.dumps(record, default=str))
    serving = record.get("serving")
    if serving and not serving["followed"]:
        # The promotion stands in the registry, but serving still answers with the old champion:
        # a scheduled run (cron, a Ray job) must fail so that someone looks.
        console.print(f"[red]promoted, but serving did not follow:[/] {serving['reason']}")
        raise typer.Exit(1)
