"""MCP ``tools/list`` answers as BEIR corpus records: the one reader for live servers and files.

A record's id is ``<server>/<tool>`` (two servers may both have a ``search`` tool); its text is
what retrievers read: the tool name, its description and each parameter's name and description;
its metadata keeps the server, the tool's own name and description and its JSON input schema as
the server sent it, which the serving catalog returns to MCP clients unchanged
(:mod:`components.serving.catalog`). A tool that cannot be used (no name, a schema that is not a
JSON Schema object) is a reject naming the server and the tool, never a silent drop.
"""

from __future__ import annotations

import json
from typing import Any

from components.data.parse import breaks_rows
from components.data.rejects import RejectLog


def tool_text(name: str, description: str, schema: dict[str, Any]) -> str:
    """Name, description, then ``parameters: p (its description); …``: the words a request shares
    with the tool are most often in the description and the parameter names."""
    params = []
    for pname, spec in (schema.get("properties") or {}).items():
        desc = spec.get("description", "") if isinstance(spec, dict) else ""
        params.append(f"{pname} ({desc})" if desc else str(pname))
    text = f"{name}: {description}".strip()
    return f"{text}. parameters: {'; '.join(params)}" if params else text


def input_schema(tool: dict[str, Any]) -> Any:
    """A ``tools/list`` entry's schema: ``inputSchema`` on the wire, ``input_schema`` in the SDK's models."""
    return tool.get("inputSchema", tool.get("input_schema"))


def usable_server_name(name: str) -> bool:
    """Whether ``name`` can be the first half of tool ids: not empty, no '/' (it separates the
    halves), no tab or line break (:func:`breaks_rows`)."""
    return bool(name) and "/" not in name and not breaks_rows(name)


def check_tool(tool: Any) -> str | None:
    """Why ``tool`` (one ``tools/list`` entry) cannot be used, or None."""
    if not isinstance(tool, dict):
        return f"expected a tool object, got {type(tool).__name__}"
    name = tool.get("name")
    if not isinstance(name, str) or not name.strip():
        return "tool has no name"
    if "/" in name:
        return f"tool name {name!r} contains '/', which separates server and tool in ids"
    if breaks_rows(name):  # kept, the tool was never served and the next ingest refused the catalog
        return f"tool name {name!r} contains a tab or line break, which ids cannot hold"
    if name != name.strip():
        # The catalog's reader strips ids: the tool would come back under another id on every run.
        return f"tool name {name!r} starts or ends with whitespace"
    if not isinstance(tool.get("description", ""), (str, type(None))):
        return "description is not a string"
    schema = input_schema(tool)
    if not isinstance(schema, dict):
        return "inputSchema is missing or not an object"
    if schema.get("type", "object") != "object":
        return f"inputSchema type is {schema.get('type')!r}; MCP tools take an object"
    if not isinstance(schema.get("properties", {}), dict):
        return "inputSchema properties is not an object"
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return "inputSchema required is not a list of names"
    return None


def corpus_records(
    server: str, tools: list[Any], rejects: RejectLog, source: str = ""
) -> list[dict[str, Any]]:
    """BEIR corpus records of one server's tools; unusable ones go to ``rejects``.

    Args:
        server: The server's name: the first half of each tool id.
        tools: Its ``tools/list`` entries (``name``, ``description``, ``inputSchema``).
        rejects: Where unusable entries go; ``file`` is ``source`` (or the server), ``line`` the
            entry's position in the list (1-based), the reason names server and tool.
        source: Where the list came from (a URL, a command, a file), for the reject log.
    """
    if not usable_server_name(server):
        raise ValueError(
            f"MCP server name {server!r}: expected a non-empty name without '/', tabs or line breaks"
        )
    records, seen = [], set()
    for i, tool in enumerate(tools, start=1):
        why = check_tool(tool)
        label = tool.get("name") if isinstance(tool, dict) else None
        if why is None and tool["name"] in seen:
            why = "duplicate tool name on this server (the first is kept)"
        if why is not None:
            reason = f"server {server!r}, tool {label!r}: {why}"
            rejects.add(source or server, i, reason, json.dumps(tool, default=str))
            continue
        seen.add(tool["name"])
        schema = input_schema(tool)
        description = str(tool.get("description") or "")
        records.append(
            {
                "_id": f"{server}/{tool['name']}",
                "title": tool["name"],
                "text": tool_text(tool["name"], description, schema),
                "metadata": {
                    "server": server,
                    "name": tool["name"],
                    "description": description,
                    "input_schema": schema,
                },
            }
        )
    return records
