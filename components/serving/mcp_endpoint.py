"""toolscout as an MCP server: ``find_tools`` and ``get_tool`` over streamable HTTP at ``/mcp``.

An agent connects with any MCP client (the Python SDK, a desktop client) and calls ``find_tools``
instead of receiving the whole catalog in its prompt. The endpoint is the official ``mcp`` SDK's
low-level server in stateless streamable-HTTP mode (no session id, JSON responses), mounted in the
Serve ingress's FastAPI app, so it sits behind the same API key middleware and runs in every
ingress replica. A ``find_tools`` call goes through the ingress's own ``_select`` (detection →
rewrite → retrieval), the code path of ``POST /v1/select``: the same request gets the same answer
on both doors. Arguments are checked by the HTTP API's own request model, and a bad one is a
tool error (``isError``) naming the field, which the model sees. Only POST is served: a stateless
server sends nothing unasked, so a GET (the stream some clients open after ``initialize``) is
answered 405, as the transport spec allows, instead of an event stream that never ends and held an
ingress request slot for good.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError
from starlette.responses import JSONResponse

from components.serving.schemas import MAX_HISTORY, MAX_QUERY_CHARS, MAX_TOP_K, SelectRequest

logger = logging.getLogger(__name__)

# What the ingress gives the endpoint: its select path and the retriever's catalog lookups.
Select = Callable[[SelectRequest], Awaitable[dict[str, Any]]]
Describe = Callable[[list[str]], Awaitable[list[dict[str, Any] | None]]]
Lookup = Callable[[str], Awaitable[list[dict[str, Any]]]]

FIND_TOOLS = types.Tool(
    name="find_tools",
    description=(
        "Find the tools (from this server's catalog) that a request needs, best first, with each "
        "tool's name, description and JSON input schema; needs_tool says whether the request needs a "
        "tool at all. Call it with the user's request before choosing a tool."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": MAX_QUERY_CHARS, "description": "The user's request."},
            "k": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K, "default": 5},
            "history": {
                "type": "array",
                "items": {"type": "string", "maxLength": MAX_QUERY_CHARS},
                "maxItems": MAX_HISTORY,
                "description": "Earlier turns of the conversation, oldest first.",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
)
GET_TOOL = types.Tool(
    name="get_tool",
    description="One catalog tool's name, description and JSON input schema, by id or name.",
    input_schema={
        "type": "object",
        "properties": {"name": {"type": "string", "description": "A tool id or name from find_tools."}},
        "required": ["name"],
        "additionalProperties": False,
    },
)


def invalid(message: str) -> MCPError:
    return MCPError(types.INVALID_PARAMS, message)


def select_request(args: dict[str, Any]) -> SelectRequest:
    """``find_tools`` arguments as the HTTP API's request (``k`` is its ``top_k``)."""
    unknown = sorted(set(args) - {"query", "k", "history"})
    if unknown:
        raise invalid(f"find_tools: unknown arguments {unknown}; it takes query, k, history")
    body = {"query": args.get("query"), "history": args.get("history", [])}
    if "k" in args:
        k = args["k"]
        # JSON Schema's "integer" admits 5.0 (a client that computed k by division sends one).
        body["top_k"] = int(k) if isinstance(k, float) and k.is_integer() else k
    try:
        return SelectRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = str(first["loc"][0]) if first["loc"] else "arguments"
        field = {"top_k": "k"}.get(where, where)
        raise invalid(f"find_tools: {field}: {first['msg']}") from None


def text(message: str) -> list[types.TextContent]:
    return [types.TextContent(type="text", text=message)]


def result(payload: dict[str, Any]) -> types.CallToolResult:
    """Structured content, and the same JSON as text for clients that read only text."""
    as_text = json.dumps(payload, ensure_ascii=False)
    return types.CallToolResult(content=text(as_text), structured_content=payload)


# This replica's binding. A module global, not an attribute: Serve ships the ingress's FastAPI app
# (and with it the endpoint object mounted in it) to each replica as a pickled copy, while the
# Ingress constructor runs against this module as the replica imported it; both reach this dict.
_BINDING: dict[str, Any] = {}


def post_only(app: Any) -> Any:
    """``app`` for POST; any other HTTP method is a 405 with ``Allow: POST`` and a JSON-RPC error
    body, as the SDK answers DELETE in stateless mode. (The SDK answered GET with an event stream
    that no stateless server ever writes to or closes.)"""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] == "POST":
            await app(scope, receive, send)
            return
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Method Not Allowed"}}
        response = JSONResponse(body, status_code=405, headers={"Allow": "POST"})
        await response(scope, receive, send)

    return asgi


class ToolSearchEndpoint:
    """The MCP server of one ingress replica; :meth:`bind` connects it to the replica's handles."""

    def __init__(self) -> None:
        self.server = Server("toolscout", on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        # The ingress's API key middleware guards the endpoint; the SDK's Host check (which would
        # refuse any Host but localhost) is left to the deployment's proxy and CORS settings.
        self.app = post_only(
            self.server.streamable_http_app(
                streamable_http_path="/",
                stateless_http=True,
                json_response=True,
                transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            )
        )

    @staticmethod
    def bind(select: Select, describe: Describe, lookup: Lookup) -> None:
        """Connect the endpoint of this process to its Ingress (see ``_BINDING``)."""
        _BINDING.update(select=select, describe=describe, lookup=lookup)

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Runs the SDK's session manager (its task group) for the life of the app."""
        async with self.server.session_manager.run():
            yield

    async def _list_tools(
        self, ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[FIND_TOOLS, GET_TOOL])

    async def _call_tool(
        self, ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            return await self._answer_call(params)
        except MCPError:
            raise
        except Exception:
            # Anything else would reach the SDK's dispatcher, which answers with the exception's
            # text (a remote traceback: hosts, pids) under JSON-RPC code 0; the HTTP door hides
            # internals too. The log keeps the whole error.
            logger.exception("MCP %s failed", params.name)
            message = f"toolscout: {params.name} failed; see the server log"
            raise MCPError(types.INTERNAL_ERROR, message) from None

    async def _answer_call(self, params: types.CallToolRequestParams) -> types.CallToolResult:
        if not _BINDING:
            raise MCPError(types.INTERNAL_ERROR, "toolscout: the endpoint is not bound to an ingress yet")
        args = params.arguments or {}
        # Bad arguments of a known tool are the tool's error (isError), not a JSON-RPC one: hosts
        # show a tool result to the model, which can then correct its call (MCP 2025-11-25,
        # SEP-1303); a protocol error reaches the host only. An unknown tool stays one (-32602).
        if params.name == "find_tools":
            try:
                request = select_request(args)
            except MCPError as e:
                return types.CallToolResult(content=text(e.error.message), is_error=True)
            return result(await self.find_tools(request))
        if params.name == "get_tool":
            name = args.get("name")
            if not isinstance(name, str) or set(args) != {"name"}:
                message = "get_tool: takes one argument, name (a string)"
                return types.CallToolResult(content=text(message), is_error=True)
            found = await _BINDING["lookup"](name)
            if not found:
                return types.CallToolResult(content=text(f"no tool {name!r} in the catalog"), is_error=True)
            if len(found) > 1:  # one name, several servers: an agent gets the ids, not a guess
                ids = ", ".join(t["id"] for t in found)
                return types.CallToolResult(
                    content=text(f"{len(found)} tools are named {name!r}: {ids}; ask for one by id"),
                    is_error=True,
                )
            return result(found[0])
        raise invalid(f"unknown tool {params.name!r}; this server has find_tools and get_tool")

    async def find_tools(self, request: SelectRequest) -> dict[str, Any]:
        """The ``/v1/select`` answer with each tool's description and input schema added."""
        answer = await _BINDING["select"](request)
        ids = [t["id"] for t in answer["tools"]]
        # No tools (a query that needs none): nothing to describe, and no call to the Retriever,
        # which the HTTP door does not need for such an answer either.
        described = await _BINDING["describe"](ids) if ids else []
        # A hit the catalog does not describe (a replica that reloaded the catalog between the
        # ranking and this call retired it) is dropped: an agent is only offered tools that exist.
        pairs = zip(answer["tools"], described, strict=True)
        tools = [{**hit, **info} for hit, info in pairs if info is not None]
        call = answer.get("call")
        if call is not None and call["tool"] not in {t["id"] for t in tools}:
            call = None  # the selector chose a tool that was just dropped
        return {**answer, "tools": tools, "call": call}
