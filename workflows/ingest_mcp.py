"""``toolscout ingest mcp``: read live MCP servers' ``tools/list`` into a BEIR corpus, in place.

Each ``--server`` is a streamable-HTTP URL or a stdio command (``"python my_server.py"``); the
official SDK's client connects, lists every page of tools, and :mod:`components.data.mcp_catalog`
turns them into records ``<server>/<tool>``. Running it again updates the corpus in place: a
server's tools that changed are rewritten, new ones added, and ones the server no longer lists are
retired (moved to ``retired.jsonl`` with the time, never silently kept or dropped); tools of servers
not named in this run are left alone. A server that cannot be reached stops the run before the
corpus is touched. Unusable tools go to ``rejects.jsonl`` with the server and tool named.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio

from components.data import io
from components.data.mcp_catalog import corpus_records, usable_server_name
from components.data.parse import split_lines
from components.data.rejects import DatasetError, RejectLog
from components.data.resolve import parse_lines, resolve_records
from components.registry.lock import RetrainLock

CORPUS, RETIRED, REJECTS = "corpus.jsonl", "retired.jsonl", "rejects.jsonl"
# How long one server may take to answer a request, and to be listed whole: a stdio command that
# never answers ``initialize`` would otherwise hold the ingest (and a cron job) forever.
READ_TIMEOUT_S, LIST_TIMEOUT_S = 60.0, 300.0
MAX_PAGES = 1000  # tools/list pages per server; a server repeating its cursor is caught sooner


@dataclass
class IngestReport:
    """What one run changed, by tool id."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    rejected: int = 0
    servers: dict[str, int] = field(default_factory=dict)  # server name → tools read


def is_url(source: str) -> bool:
    return source.lower().startswith(("http://", "https://"))  # a scheme is case-insensitive


async def list_server_tools(
    source: str, headers: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> tuple[str, list[dict]]:
    """``(server name, tools/list entries as dicts)`` of one server, every page of it.

    ``env``: variables a stdio server gets besides the few the SDK passes on (``HOME``, ``PATH``,
    ``USER``…): an API key it reads from its environment."""
    from mcp import Client, StdioServerParameters, stdio_client

    if is_url(source):
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers=headers or {}, timeout=60)
        target: Any = streamable_http_client(source, http_client=http)
    else:
        argv = shlex.split(source)
        if not argv:
            raise ValueError("ingest mcp: an empty --server")
        http = None
        # The server's own stderr (its log) goes to the real stderr: under a captured or redirected
        # sys.stderr (tests, quiet output) the SDK would need a file descriptor it does not have.
        command = StdioServerParameters(command=argv[0], args=argv[1:], env=env or None)
        target = stdio_client(command, errlog=sys.__stderr__)
    try:
        with anyio.fail_after(LIST_TIMEOUT_S, reason=f"no complete tools/list within {LIST_TIMEOUT_S:.0f} s"):
            async with Client(target, read_timeout_seconds=READ_TIMEOUT_S) as client:
                tools, cursor, seen = [], None, set()
                for _ in range(MAX_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    tools += [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in page.tools]
                    cursor = page.next_cursor
                    if not cursor:
                        break
                    if cursor in seen:
                        raise ValueError(f"tools/list returned the cursor {cursor!r} twice")
                    seen.add(cursor)
                else:
                    raise ValueError(f"tools/list did not end after {MAX_PAGES} pages")
                name = client.server_info.name if client.server_info else ""
    finally:
        if http is not None:
            await http.aclose()
    return name, tools


def reason(error: BaseException) -> str:
    """What went wrong, from the innermost errors: the SDK's task groups wrap a refused connection,
    a 401 or a malformed listing in exception groups whose own message says only how many."""
    members = getattr(error, "exceptions", None)
    if isinstance(members, tuple) and members:
        return "; ".join(dict.fromkeys(reason(e) for e in members))
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def merge_server(
    corpus: dict[str, dict], server: str, records: list[dict], report: IngestReport
) -> list[dict[str, Any]]:
    """Apply one server's fresh records to ``corpus`` (id → record, in order); return the retired."""
    fresh = {r["_id"]: r for r in records}
    retired = [
        r for tid, r in corpus.items() if r.get("metadata", {}).get("server") == server and tid not in fresh
    ]
    for r in retired:
        del corpus[r["_id"]]
        report.retired.append(r["_id"])
    for tid, record in fresh.items():
        old = corpus.get(tid)
        (report.added if old is None else report.unchanged if old == record else report.updated).append(tid)
        corpus[tid] = record
    return retired


def read_catalog(path: str) -> dict[str, dict[str, Any]]:
    """The catalog an earlier ingest wrote, by ``_id``, read by the loader's row rules. It is
    rewritten whole, so a row that cannot be read (or a second row with the same id) would be
    dropped from it without a word: such a catalog is refused, naming file and line.

    Raises:
        DatasetError: a malformed row or a repeated ``_id``; nothing is written.
    """
    if not io.exists(path):
        return {}
    rows, rejects = parse_lines("records", path, split_lines(io.read_bytes(path)))
    log = RejectLog()
    log.extend(rejects)
    records = resolve_records(path, rows, log)
    if len(log):
        raise DatasetError(
            f"ingest mcp: {len(log)} catalog row(s) cannot be kept; fix them first:{log.listing(20)}"
        )
    return records


def ingest_mcp(
    out_dir: str,
    sources: list[str],
    names: list[str] | None = None,
    headers: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    allow_empty: bool = False,
) -> IngestReport:
    """Read every server, then update ``out_dir``'s corpus in place (see the module docstring).

    Args:
        sources: Server URLs or stdio commands.
        names: Server names to use instead of the ones the servers report (one per source).
        headers: HTTP headers for a URL server (a Bearer token): one URL server per run.
        env: Environment variables for the stdio servers (see :func:`list_server_tools`).
        allow_empty: Let a server that lists no usable tool retire all of its catalogued ones.
    """
    if names and len(names) != len(sources):
        raise ValueError(
            f"ingest mcp: {len(names)} --name for {len(sources)} --server; give one each or none"
        )
    if headers and sum(map(is_url, sources)) > 1:
        # One token for every URL server would hand one service's credential to the others.
        raise ValueError("ingest mcp: a Bearer token goes to one URL server; ingest them one run each")
    listed = []
    for i, source in enumerate(sources):
        try:
            reported, tools = asyncio.run(list_server_tools(source, headers, env))
        except Exception as e:  # nothing is written when a server cannot be read
            raise OSError(f"ingest mcp: cannot list the tools of {source!r}: {reason(e)}") from e
        # Stripped: the catalog's reader strips ids, so " srv" would come back as another server
        # on every run and retire and re-add its tools.
        name = ((names[i] if names else reported) or "").strip()
        if not name:
            raise ValueError(f"ingest mcp: {source!r} reports no server name; pass --name")
        if not usable_server_name(name):
            raise ValueError(
                f"ingest mcp: {source!r} reports the server name {name!r}, whose '/', tab or line "
                "break its tool ids cannot hold; give it another with --name"
            )
        listed.append((name, source, tools))
    names_seen: dict[str, str] = {}
    for name, source, _ in listed:
        # Tools are retired by server name: a second server under the same name (the SDK's default
        # is "mcp-server") would retire the first one's tools in this very run.
        if name in names_seen:
            raise ValueError(
                f"ingest mcp: {names_seen[name]!r} and {source!r} both report the server name {name!r}; "
                "give each its own with --name"
            )
        names_seen[name] = source
    with catalog_lock(out_dir):
        return update_catalog(out_dir, listed, bool(names), names_seen, allow_empty)


class IngestLock(RetrainLock):
    """One ingest at a time per catalog (a cron run and a manual one): each reads the corpus, merges
    its servers and rewrites it whole, so the second to write dropped the first one's changes."""

    holder_is = "another ingest"


def catalog_lock(out_dir: str) -> contextlib.AbstractContextManager[Any]:
    """:class:`IngestLock` on a local catalog; none on an object store, which has no atomic create
    to lock with (there the scheduler's ``concurrencyPolicy: Forbid`` keeps runs apart)."""
    if io.is_remote(out_dir):
        return contextlib.nullcontext()
    return IngestLock(os.path.join(io.local_path(out_dir), ".ingest.lock"))


def update_catalog(
    out_dir: str,
    listed: list[tuple[str, str, list[Any]]],
    named: bool,
    names_seen: dict[str, str],
    allow_empty: bool,
) -> IngestReport:
    """Merge the servers' ``listed`` tools into ``out_dir``'s catalog and write it (under the lock)."""
    corpus = read_catalog(io.join(out_dir, CORPUS))
    if not named:
        # Across runs too: a server that reports the name another source's tools are under (the
        # SDK's default "mcp-server") would retire them. Naming it with --name says it is that
        # server (one that moved, say) and replaces them.
        for name, source, _ in listed:
            ours = [r["metadata"] for r in corpus.values() if r["metadata"].get("server") == name]
            known = {meta.get("source") for meta in ours}
            other = sorted(str(s) for s in known - {source, None})
            if other:
                raise ValueError(
                    f"ingest mcp: {source!r} reports the server name {name!r}, whose tools in the "
                    f"catalog came from {other[0]!r}; give it its own name with --name (or that "
                    "name, to replace them)"
                )
    report, rejects, retired = IngestReport(), RejectLog(), []
    for name, source, tools in listed:
        records = corpus_records(name, tools, rejects, source)
        catalogued = sum(r["metadata"].get("server") == name for r in corpus.values())
        if not records and catalogued and not allow_empty:
            # A server restarting, or one whose every tool is now rejected, would retire its
            # whole catalogue (and with --follow, serving would drop it at once).
            raise ValueError(
                f"ingest mcp: {source!r} lists no usable tool, which would retire all {catalogued} "
                f"of {name!r} in the catalog; pass --allow-empty if that is meant"
            )
        for record in records:  # which source a server name's tools came from (see above)
            record["metadata"]["source"] = source
        retired += merge_server(corpus, name, records, report)
        report.servers[name] = len(tools)
    # Retired records first: a run stopped between the two writes then leaves a tool both in the
    # corpus and in retired.jsonl (the next run settles it), never a tool in neither.
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    retired_file = io.join(out_dir, RETIRED)
    io.write_jsonl(retired_file, io.read_jsonl(retired_file) + [{**r, "retired_at": stamp} for r in retired])
    io.write_jsonl(io.join(out_dir, CORPUS), list(corpus.values()))  # replaced whole, atomically
    # This run's rejects replace those of the servers it read; other servers' rejects stay.
    rejects_file = io.join(out_dir, REJECTS)
    ours = {source or name for name, source, _ in listed} | set(names_seen)
    kept = [r for r in io.read_jsonl(rejects_file) if r.get("file") not in ours]
    io.write_jsonl(rejects_file, kept + [asdict(r) for r in rejects.sorted()])
    report.rejected = len(rejects)
    return report
