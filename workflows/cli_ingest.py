"""``toolscout ingest``: tool catalogs from other sources (MCP servers) into the BEIR layout."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from workflows.cli_guard import console, guarded

ingest_app = typer.Typer(
    help="Read tool catalogs from other sources into the BEIR layout.", no_args_is_help=True
)

Servers = Annotated[list[str], typer.Option("--server", help="An MCP server URL or stdio command (repeat).")]


@ingest_app.command("mcp")
@guarded
def ingest_mcp(
    server: Servers,
    out: Annotated[
        str, typer.Option("--out", help="BEIR dataset dir (local or s3://) whose corpus.jsonl is updated.")
    ],
    name: Annotated[
        list[str] | None, typer.Option("--name", help="Server name in tool ids, one per --server.")
    ] = None,
    bearer_env: Annotated[
        str | None, typer.Option(help="Environment variable holding a Bearer token for URL servers.")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            help="Environment variable passed on to the stdio servers (repeat); they get only "
            "HOME, PATH, USER and a few more otherwise.",
        ),
    ] = None,
    allow_empty: Annotated[
        bool, typer.Option(help="Let a server listing no usable tool retire all of its catalogued ones.")
    ] = False,
    follow: Annotated[
        str | None,
        typer.Option(help="Ray address of a cluster serving this catalog: its Retriever replicas reload it."),
    ] = None,
) -> None:
    """List MCP servers' tools into a BEIR corpus: updated in place, vanished tools retired."""
    from workflows.ingest_mcp import ingest_mcp as run_ingest

    if bearer_env and not os.environ.get(bearer_env):
        raise typer.BadParameter(f"environment variable {bearer_env} is not set", param_hint="--bearer-env")
    headers = {"Authorization": f"Bearer {os.environ[bearer_env]}"} if bearer_env else None
    missing = [v for v in env or [] if v not in os.environ]
    if missing:
        raise typer.BadParameter(f"environment variable(s) {', '.join(missing)} not set", param_hint="--env")
    passed = {v: os.environ[v] for v in env or []}
    report = run_ingest(out, server, name, headers, passed, allow_empty)
    console.print(
        f"{sum(report.servers.values())} tools from {len(report.servers)} servers → {out}/corpus.jsonl: "
        f"{len(report.added)} added, {len(report.updated)} updated, {len(report.unchanged)} unchanged, "
        f"{len(report.retired)} retired (retired.jsonl), {report.rejected} rejected (rejects.jsonl)",
        soft_wrap=True,  # one line, whatever the terminal's width: scripts grep it
    )
    if follow:
        import ray

        from components.serving.swap import SwapFailed, refresh_catalog

        ray.init(address=follow, logging_level="ERROR", log_to_driver=False)
        try:
            console.print(f"serving reloaded the catalog: version {refresh_catalog()}")
        except SwapFailed as e:  # the corpus is written; serving did not follow it
            console.print(f"[bold red]error:[/] the corpus is updated, but serving did not reload it: {e}")
            raise typer.Exit(1) from e
