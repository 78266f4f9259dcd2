"""``toolscout ingest mcp``: a real stdio MCP server (the SDK's MCPServer, v1's FastMCP) read into a
BEIR corpus, updated in place, a vanished tool retired; unusable tools rejected with names."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from components.data.loader import load_dataset
from components.data.mcp_catalog import corpus_records
from components.data.rejects import RejectLog
from components.serving.catalog import load_catalog
from workflows.cli import app

SERVER = '''
import json, sys
from typing import Annotated
from pydantic import Field
from mcp.server.mcpserver import MCPServer

server = MCPServer("weather-desk")

def forecast(city: Annotated[str, Field(description="city name")], days: int = 3) -> str:
    """Daily weather forecast for a city."""
    return city

def convert(amount: float, currency: Annotated[str, Field(description="ISO currency code")]) -> float:
    """Convert an amount of money between currencies."""
    return amount

def alerts(region: str) -> str:
    """Severe weather alerts for a region."""
    return region

wanted = json.load(open(sys.argv[1]))
import os
for fn in (forecast, convert, alerts):
    if fn.__name__ in wanted["tools"]:
        description = wanted.get("descriptions", {}).get(fn.__name__)
        if description == "$WEATHER_KEY":  # what the server's environment holds
            description = "key: " + os.environ.get("WEATHER_KEY", "unset")
        server.add_tool(fn, description=description)
server.run()
'''


def stdio_server(tmp_path: Path, tools: list[str], descriptions: dict | None = None, tag: str = "") -> str:
    """The command line of the weather-desk server listing ``tools``."""
    script, wanted = tmp_path / "server.py", tmp_path / f"wanted{tag}.json"
    script.write_text(SERVER)
    wanted.write_text(json.dumps({"tools": tools, "descriptions": descriptions or {}}))
    return f"{sys.executable} {script} {wanted}"


def ingest(tmp_path: Path, *servers: str, options: tuple[str, ...] = (), out: str | None = None):
    args = ["ingest", "mcp", "--out", out or str(tmp_path / "cat"), *options]
    return CliRunner().invoke(app, args + [a for s in servers for a in ("--server", s)])


def run_ingest(tmp_path: Path, tools: list[str], descriptions: dict | None = None) -> str:
    result = ingest(tmp_path, stdio_server(tmp_path, tools, descriptions))
    assert result.exit_code == 0, result.output
    return result.output


def corpus(tmp_path: Path) -> dict[str, dict]:
    lines = (tmp_path / "cat" / "corpus.jsonl").read_text().splitlines()
    return {r["_id"]: r for r in map(json.loads, lines)}


def test_ingest_from_a_stdio_server_then_update_in_place_and_retire(tmp_path):
    out = run_ingest(tmp_path, ["forecast", "convert"])
    assert re.search(r"\b2 added, 0 updated, 0 unchanged, 0 retired\b", out), out
    first = corpus(tmp_path)
    assert list(first) == ["weather-desk/forecast", "weather-desk/convert"]
    forecast = first["weather-desk/forecast"]
    assert (
        forecast["text"] == "forecast: Daily weather forecast for a city.. parameters: city (city name); days"
    )
    schema = forecast["metadata"]["input_schema"]
    assert schema["required"] == ["city"] and set(schema["properties"]) == {"city", "days"}
    assert forecast["metadata"]["server"] == "weather-desk"
    # The serving catalog answers MCP clients with the server's own name, description and schema.
    tool = load_catalog(str(tmp_path / "cat")).tools["weather-desk/convert"]
    assert (
        tool.name == "convert"
        and tool.json_schema()["properties"]["currency"]["description"] == "ISO currency code"
    )

    out = run_ingest(tmp_path, ["forecast", "alerts"], {"forecast": "Hourly and daily forecast."})
    assert re.search(r"\b1 added, 1 updated, 0 unchanged, 1 retired\b", out), out
    second = corpus(tmp_path)
    assert list(second) == ["weather-desk/forecast", "weather-desk/alerts"]
    assert second["weather-desk/forecast"]["metadata"]["description"] == "Hourly and daily forecast."
    retired = [json.loads(x) for x in (tmp_path / "cat" / "retired.jsonl").read_text().splitlines()]
    assert [r["_id"] for r in retired] == ["weather-desk/convert"] and retired[0]["retired_at"]
    assert retired[0]["metadata"]["input_schema"] == first["weather-desk/convert"]["metadata"]["input_schema"]


def test_an_unreachable_server_changes_nothing(tmp_path):
    run_ingest(tmp_path, ["forecast"])
    before = (tmp_path / "cat" / "corpus.jsonl").read_text()
    # The first server is read and would change the corpus; the second cannot be: nothing is written.
    changed = stdio_server(tmp_path, ["forecast", "alerts"], tag="2")
    result = ingest(tmp_path, changed, "http://127.0.0.1:9/mcp/")
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "cannot list the tools of 'http://127.0.0.1:9/mcp/'" in said
    # Why, from inside the SDK's exception groups (before: "unhandled errors in a TaskGroup").
    assert re.search(r"mcp/': \w*ConnectError: \S", said) and "TaskGroup" not in said, said
    assert (tmp_path / "cat" / "corpus.jsonl").read_text() == before
    assert not (tmp_path / "cat" / "retired.jsonl").read_text()


def test_a_stdio_server_gets_only_the_environment_variables_passed_on(tmp_path, monkeypatch):
    monkeypatch.setenv("WEATHER_KEY", "k-42")
    server = stdio_server(tmp_path, ["forecast"], {"forecast": "$WEATHER_KEY"})
    # (Without --env the SDK passes on HOME, PATH, USER and a few more only: "key: unset".)
    result = ingest(tmp_path, server, options=("--env", "WEATHER_KEY"))
    assert result.exit_code == 0, result.output
    assert corpus(tmp_path)["weather-desk/forecast"]["metadata"]["description"] == "key: k-42"
    missing = ingest(tmp_path, server, options=("--env", "NO_SUCH_VARIABLE_HERE"))
    assert missing.exit_code != 0 and "NO_SUCH_VARIABLE_HERE" in missing.output


def test_a_server_listing_nothing_retires_its_tools_only_when_allowed(tmp_path):
    run_ingest(tmp_path, ["forecast", "alerts"])
    before = (tmp_path / "cat" / "corpus.jsonl").read_text()
    empty = stdio_server(tmp_path, [])  # the same server, restarting, say, or every tool now rejected
    refused = ingest(tmp_path, empty)
    said = " ".join(refused.output.split())
    assert refused.exit_code == 1 and "would retire all 2 of 'weather-desk'" in said, said
    assert (tmp_path / "cat" / "corpus.jsonl").read_text() == before
    assert ingest(tmp_path, empty, options=("--allow-empty",)).exit_code == 0
    assert corpus(tmp_path) == {}
    assert len((tmp_path / "cat" / "retired.jsonl").read_text().splitlines()) == 2


def test_one_bearer_token_is_not_sent_to_two_url_servers(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "secret")
    urls = ("https://github-mcp.example/mcp", "https://third-party.example/mcp")
    result = ingest(tmp_path, *urls, options=("--bearer-env", "GITHUB_TOKEN"))
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "a Bearer token goes to one URL server" in said
    assert not (tmp_path / "cat").exists()


def test_a_url_scheme_in_capitals_is_still_a_url():
    from workflows.ingest_mcp import is_url

    # Run as a stdio command before ("HTTP://..." is no program).
    assert is_url("HTTPS://mcp.example.com/mcp") and is_url("http://127.0.0.1:9/mcp/")
    assert not is_url("python server.py")


def test_two_servers_reporting_one_name_are_refused_before_either_retires_the_other(tmp_path):
    run_ingest(tmp_path, ["forecast"])
    before = (tmp_path / "cat" / "corpus.jsonl").read_text()
    first, second = stdio_server(tmp_path, ["forecast"], tag="a"), stdio_server(tmp_path, ["alerts"], tag="b")
    result = ingest(tmp_path, first, second)
    said = " ".join(result.output.split())  # the console wraps long lines where the paths end
    assert result.exit_code == 1 and "both report the server name 'weather-desk'" in said
    assert (tmp_path / "cat" / "corpus.jsonl").read_text() == before


def test_another_source_under_a_catalogued_server_name_is_refused_unless_named(tmp_path):
    # Runs apart: a second server reporting the same name (the SDK's default is "mcp-server") would
    # retire the first one's tools, which the catalog keeps under that name.
    run_ingest(tmp_path, ["forecast", "convert"])
    before = (tmp_path / "cat" / "corpus.jsonl").read_text()
    other = stdio_server(tmp_path, ["alerts"], tag="other")
    result = ingest(tmp_path, other)
    assert result.exit_code == 1, result.output
    assert "reports the server name 'weather-desk', whose tools in the catalog came from" in " ".join(
        result.output.split()
    )
    assert (tmp_path / "cat" / "corpus.jsonl").read_text() == before
    # Named explicitly, it is that server (moved, say): its tools replace the old ones. (The name
    # is stripped: " weather-desk " became another server, whose ids the reader then stripped.)
    args = ["ingest", "mcp", "--out", str(tmp_path / "cat"), "--server", other, "--name", " weather-desk "]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert list(corpus(tmp_path)) == ["weather-desk/alerts"]
    assert corpus(tmp_path)["weather-desk/alerts"]["metadata"]["source"] == other


def test_a_run_keeps_the_rejects_of_servers_it_did_not_read(tmp_path):
    (tmp_path / "cat").mkdir()
    other = {"file": "https://other.example/mcp", "line": 3, "reason": "tool 'x': inputSchema is missing"}
    (tmp_path / "cat" / "rejects.jsonl").write_text(json.dumps({**other, "content": "{}"}) + "\n")
    run_ingest(tmp_path, ["forecast"])
    kept = [json.loads(x) for x in (tmp_path / "cat" / "rejects.jsonl").read_text().splitlines()]
    assert kept == [{**other, "content": "{}"}]


@pytest.mark.parametrize(
    "tool, says",
    [
        ({"description": "x", "inputSchema": {"type": "object"}}, "tool None: tool has no name"),
        ({"name": "a/b", "inputSchema": {"type": "object"}}, "contains '/'"),
        ({"name": "search ", "inputSchema": {"type": "object"}}, "starts or ends with whitespace"),
        # Kept, they were never served, and the next ingest refused the whole catalog.
        ({"name": "get\tweather", "inputSchema": {"type": "object"}}, "contains a tab or line break"),
        ({"name": "line\nbreak", "inputSchema": {"type": "object"}}, "contains a tab or line break"),
        ({"name": "s", "inputSchema": {"type": "string"}}, "tool 's': inputSchema type is 'string'"),
        ({"name": "s"}, "tool 's': inputSchema is missing"),
        ({"name": "s", "inputSchema": {"type": "object", "properties": []}}, "properties is not an object"),
        ({"name": "s", "inputSchema": {"type": "object", "required": "q"}}, "required is not a list"),
    ],
)
def test_an_unusable_tool_is_rejected_naming_server_and_tool(tool, says):
    rejects = RejectLog()
    good = {"name": "ok", "description": "fine", "inputSchema": {"type": "object", "properties": {}}}
    records = corpus_records("srv", [good, tool], rejects, "http://host/mcp")
    assert [r["_id"] for r in records] == ["srv/ok"]
    (reject,) = rejects.rejects
    assert reject.file == "http://host/mcp" and reject.line == 2
    assert "server 'srv'" in reject.reason and says in reject.reason
    assert json.loads(reject.content) == tool


def test_a_server_name_ids_cannot_hold_is_refused():
    for server in ("tab\tsrv", "a/b", ""):
        with pytest.raises(ValueError, match="MCP server name"):
            corpus_records(server, [], RejectLog())


def test_an_ingested_catalog_is_a_dataset_once_it_has_queries(tmp_path):
    run_ingest(tmp_path, ["forecast", "convert", "alerts"])
    cat = tmp_path / "cat"
    (cat / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "will it rain in Oslo"}) + "\n")
    (cat / "qrels").mkdir()
    (cat / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tweather-desk/forecast\t1\n")
    data = load_dataset(str(cat))  # zero-shot: a test split only, as LiveMCPBench
    assert sorted(data.corpus) == ["weather-desk/alerts", "weather-desk/convert", "weather-desk/forecast"]
    assert data.qrels["test"] == {"q1": {"weather-desk/forecast": 1}}


def test_a_catalog_row_that_cannot_be_kept_stops_the_ingest(tmp_path):
    # The catalog is rewritten whole: a row it cannot read, or a second row with the same id,
    # would vanish from it. The ingest refuses instead, naming file and line.
    from components.data.rejects import DatasetError
    from workflows.ingest_mcp import read_catalog

    path = tmp_path / "corpus.jsonl"
    good = json.dumps({"_id": "s/a", "title": "a", "text": "first", "metadata": {}})
    path.write_text(f'{good}\n{{"_id": "s/b", "text": \n{json.dumps({"_id": "s/a", "text": "again"})}\n')
    with pytest.raises(DatasetError) as e:
        read_catalog(str(path))
    assert f"{path}:2: " in str(e.value) and f"{path}:3: duplicate _id 's/a'" in str(e.value)
    path.write_text(good + "\n")
    assert read_catalog(str(path)) == {"s/a": json.loads(good)}


def test_a_second_ingest_of_one_catalog_is_refused_while_one_runs(tmp_path):
    # A cron run and a manual one each read the corpus, merged their servers and rewrote it whole:
    # the second to write dropped the first one's changes. One holds the catalog's lock now.
    from workflows.ingest_mcp import IngestLock

    run_ingest(tmp_path, ["forecast"])
    before = (tmp_path / "cat" / "corpus.jsonl").read_text()
    with IngestLock(str(tmp_path / "cat" / ".ingest.lock")):
        result = ingest(tmp_path, stdio_server(tmp_path, ["forecast", "alerts"], tag="2"))
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "another ingest holds" in said, said
    assert (tmp_path / "cat" / "corpus.jsonl").read_text() == before
    assert re.search(r"\b1 added\b", run_ingest(tmp_path, ["forecast", "alerts"]))  # released: it runs
