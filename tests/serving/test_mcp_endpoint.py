"""The MCP endpoint on its own (no Ray): the SDK's client talks to it in-process, over a real
catalog, with the ingress's select / describe / lookup replaced by plain coroutines."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from components.serving import mcp_endpoint
from components.serving.catalog import ToolCatalog
from components.serving.mcp_endpoint import ToolSearchEndpoint


def mcp_tool(server: str, name: str) -> dict[str, Any]:
    """A corpus record as ``toolscout ingest mcp`` writes it."""
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    return {
        "_id": f"{server}/{name}",
        "title": name,
        "text": f"{name} on {server}",
        "metadata": {
            "server": server,
            "name": name,
            "description": f"{name} ({server})",
            "input_schema": schema,
        },
    }


CATALOG = ToolCatalog.from_records(
    [mcp_tool("github", "search"), mcp_tool("slack", "search"), mcp_tool("slack", "post")]
)


@pytest.fixture
def bound():
    """The endpoint bound to ``CATALOG``; yields the answers its select returns, in order."""
    answers: list[Any] = []

    async def select(request):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def describe(tool_ids):
        return [CATALOG.describe(t) for t in tool_ids]

    async def lookup(key):
        return CATALOG.lookup(key)

    ToolSearchEndpoint.bind(select, describe, lookup)
    yield answers
    mcp_endpoint._BINDING.clear()


def call(tool: str, args: dict[str, Any]):
    """One ``tools/call`` over streamable HTTP, as an agent sends it: the SDK's client, an endpoint's
    own ASGI app (lifespan included: a session manager runs once, so one endpoint per call) and its
    JSON-RPC dispatcher, with no socket in between."""
    endpoint = ToolSearchEndpoint()

    async def work():
        async with endpoint.lifespan():
            transport = httpx2.ASGITransport(app=endpoint.app)
            http = httpx2.AsyncClient(transport=transport, base_url="http://mcp.test")
            async with http, Client(streamable_http_client("http://mcp.test/", http_client=http)) as client:
                return await client.call_tool(tool, args)

    try:
        return asyncio.run(work())
    except Exception as e:  # anyio's task groups wrap what the client raised in exception groups
        inner = leaves(e)
        if len(inner) == 1 and inner[0] is not e:
            raise inner[0] from None
        raise


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside nested exception groups (``exceptions``: a group's members)."""
    members = getattr(error, "exceptions", None)
    if not isinstance(members, tuple):
        return [error]
    return [leaf for e in members for leaf in leaves(e)]


def answer(ids: list[str], call_tool: str | None) -> dict[str, Any]:
    call_ = {"tool": call_tool, "arguments": {"q": "x"}} if call_tool else None
    return {
        "needs_tool": True,
        "probability": 0.9,
        "tools": [{"id": t, "name": t, "score": 1.0 - i / 10} for i, t in enumerate(ids)],
        "call": call_,
        "model_version": "bm25/v0001",
        "versions": {"detector": "bm25/v0001", "retriever": "bm25/v0001", "selector": None},
        "timings_ms": {},
    }


def test_get_tool_by_a_name_two_servers_share_names_both_and_picks_neither(bound):
    shared = call("get_tool", {"name": "search"})
    assert shared.is_error
    assert "github/search" in shared.content[0].text and "slack/search" in shared.content[0].text
    by_id = call("get_tool", {"name": "slack/search"})
    assert not by_id.is_error and by_id.structured_content["id"] == "slack/search"
    unique = call("get_tool", {"name": "post"})
    assert unique.structured_content["id"] == "slack/post"
    assert call("get_tool", {"name": "nothing"}).is_error


def test_find_tools_drops_a_hit_and_a_call_the_catalog_no_longer_has(bound):
    answers = bound
    # slack/retired was ranked, then retired by a catalog reload; the selector had chosen it.
    answers.append(answer(["slack/post", "slack/retired", "github/search"], call_tool="slack/retired"))
    found = call("find_tools", {"query": "post a message", "k": 3}).structured_content
    assert [t["id"] for t in found["tools"]] == ["slack/post", "github/search"]
    assert found["tools"][0]["input_schema"]["required"] == ["q"]
    assert found["call"] is None
    answers.append(answer(["slack/post"], call_tool="slack/post"))
    kept = call("find_tools", {"query": "post a message"}).structured_content
    assert kept["call"] == {"tool": "slack/post", "arguments": {"q": "x"}}


def test_an_answer_without_tools_asks_the_catalog_nothing(bound):
    # The HTTP door answers a query that needs no tool from the detector alone; the MCP door asked
    # the Retriever to describe an empty list, and failed while the Retriever was down.
    async def retriever_down(tool_ids):
        raise RuntimeError("Retriever unavailable")

    mcp_endpoint._BINDING["describe"] = retriever_down
    bound.append({**answer([], None), "needs_tool": False, "probability": 0.1})
    found = call("find_tools", {"query": "hello there"})
    assert not found.is_error
    assert found.structured_content["tools"] == [] and found.structured_content["needs_tool"] is False


def test_a_failure_inside_is_an_internal_error_without_its_details(bound):
    answers = bound
    answers.append(RuntimeError("RayTaskError on 10.1.2.3 pid=4242: Traceback ..."))
    # The SDK answers an unexpected exception by protocol: this (current) client gets a bare
    # "Internal server error", but clients on the pre-2026 protocol got JSON-RPC code 0 and the
    # exception's own text (here a remote traceback's host and pid). The endpoint answers both
    # with its own message.
    with pytest.raises(MCPError) as raised:
        call("find_tools", {"query": "post a message"})
    assert raised.value.error.code == -32603  # JSON-RPC internal error
    assert "10.1.2.3" not in str(raised.value) and "find_tools failed" in str(raised.value)


@pytest.mark.parametrize(
    "tool, args, says",
    [
        ("find_tools", {"query": "weather", "k": 0}, "find_tools: k:"),
        ("find_tools", {"query": "weather", "top": 3}, "unknown arguments ['top']"),
        ("get_tool", {"id": "slack/post"}, "get_tool: takes one argument, name"),
    ],
)
def test_bad_arguments_are_a_tool_error_the_model_sees(bound, tool, args, says):
    # MCP 2025-11-25 (SEP-1303): input validation errors are tool results with isError, which hosts
    # put in the model's context, not JSON-RPC errors, which they do not.
    result = call(tool, args)
    assert result.is_error and says in result.content[0].text, result.content[0].text
    assert not bound  # nothing was selected


def test_an_unknown_tool_is_still_a_protocol_error(bound):
    with pytest.raises(MCPError) as raised:
        call("find_tool", {"query": "x"})
    assert raised.value.error.code == -32602 and "unknown tool 'find_tool'" in raised.value.error.message


def test_k_written_as_a_whole_float_is_an_integer(bound):
    bound.append(answer(["slack/search"], None))
    result = call("find_tools", {"query": "search messages", "k": 1.0})
    assert not result.is_error and [t["id"] for t in result.structured_content["tools"]] == ["slack/search"]
    result = call("find_tools", {"query": "search messages", "k": 1.5})
    assert result.is_error and "k:" in result.content[0].text


def test_a_get_is_refused_at_once_not_left_open(bound):
    # A stateless server sends nothing unasked: the SDK answered GET with an event stream it never
    # wrote to or closed, holding an ingress request slot for good. The transport spec allows 405.
    endpoint = ToolSearchEndpoint()

    async def work():
        async with endpoint.lifespan():
            transport = httpx2.ASGITransport(app=endpoint.app)
            async with httpx2.AsyncClient(transport=transport, base_url="http://mcp.test") as http:
                accept = {"Accept": "text/event-stream, application/json"}
                return await asyncio.wait_for(http.get("/", headers=accept), timeout=30)

    got = asyncio.run(work())
    assert got.status_code == 405 and got.headers["allow"] == "POST"
    assert got.json()["error"]["code"] == -32600
    # POST still serves the protocol (the SDK's own client: initialize, then tools/call).
    bound.append(answer(["github/search"], None))
    assert not call("find_tools", {"query": "find a repo"}).is_error
