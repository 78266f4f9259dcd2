"""The tool catalog a server answers with: names and parameter schemas, read from a dataset's corpus.

Artifacts store tool ids only, so the names shown to clients and the schemas the selector fills
come from the dataset the artifact was trained on (a raw BEIR dir or a prepared one).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from components.data import io
from components.data.parse import parse_record, split_lines
from components.data.prepared import is_prepared, read_table
from components.data.tooltext import parse_tool_text

# ToolBench writes parameter types in many spellings; JSON Schema has a handful.
_JSON_TYPES = {
    "string": "string",
    "str": "string",
    "number": "number",
    "float": "number",
    "double": "number",
    "integer": "integer",
    "int": "integer",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "object": "object",
}


@dataclass(frozen=True)
class Param:
    """One parameter of a tool, with its JSON Schema type (``string`` when unknown)."""

    name: str
    type: str
    description: str = ""


@dataclass(frozen=True)
class Tool:
    """A catalog entry."""

    id: str
    name: str
    description: str = ""
    required: tuple[Param, ...] = ()
    optional: tuple[Param, ...] = ()
    # An MCP tool's own inputSchema (``metadata.input_schema`` of its corpus record), served as is.
    input_schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    def call_params(self) -> tuple[Param, ...]:
        """The parameters a call must fill: a ToolBench tool's parsed required ones, or an MCP
        tool's ``required`` keys with the types its own input schema gives them."""
        if self.input_schema is None:
            return self.required
        props = self.input_schema.get("properties") or {}
        return tuple(
            Param(str(name), json_type((props.get(name) or {}).get("type")))
            for name in self.input_schema.get("required") or []
        )

    def argument_errors(self, arguments: Any) -> str | None:
        """Why ``arguments`` is not a valid call of this tool under :meth:`json_schema` (types,
        enums, required keys, nested shapes), or None. For answers a model wrote freely (an HTTP
        endpoint) or from a narrower grammar (llama.cpp's covers required keys and base types)."""
        import jsonschema

        schema = self.json_schema()
        try:
            validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            error = jsonschema.exceptions.best_match(validator(schema).iter_errors(arguments))
        except jsonschema.exceptions.SchemaError as e:  # the tool's own schema is broken
            return f"{self.id}: its input schema is not a JSON Schema: {e.message}"
        if error is None:
            return None
        where = "/".join(map(str, error.absolute_path)) or "arguments"
        return f"{self.id}: {where}: {error.message}"

    def json_schema(self) -> dict[str, Any]:
        """The arguments as a JSON Schema object (``title`` carries the human-readable name)."""
        if self.input_schema is not None:
            return self.input_schema
        props = {
            p.name: {"type": p.type, "description": p.description} for p in self.required + self.optional
        }
        return {
            "type": "object",
            "title": self.name,
            "properties": props,
            "required": [p.name for p in self.required],
        }


def json_type(raw: Any) -> str:
    """Map a ToolBench type name to a JSON Schema type."""
    return _JSON_TYPES.get(str(raw or "").strip().lower(), "string")


def _params(items: list[dict]) -> tuple[Param, ...]:
    # Nameless entries are free-text leftovers of unparsable schemas (see tooltext): no argument.
    return tuple(
        Param(str(p["name"]), json_type(p.get("type")), str(p.get("description") or ""))
        for p in items
        if p.get("name")
    )


def tool_from_record(record: dict) -> Tool:
    """A catalog entry from a BEIR corpus record: an MCP tool (``metadata.input_schema``, written by
    :mod:`components.data.mcp_catalog`) keeps its own name, description and schema; a ToolBench
    record's are parsed from its text."""
    meta = record.get("metadata") or {}
    if isinstance(meta.get("input_schema"), dict):
        return Tool(
            id=str(record["_id"]),
            name=str(meta.get("name") or record.get("title") or record["_id"]),
            description=str(meta.get("description") or ""),
            input_schema=meta["input_schema"],
        )
    parsed = parse_tool_text(str(record["_id"]), record.get("text", ""))
    name = parsed.name if (parsed.tool or parsed.api) else (record.get("title") or parsed.id)
    return Tool(
        id=parsed.id,
        name=name,
        description=parsed.description,
        required=_params(parsed.required_params),
        optional=_params(parsed.optional_params),
    )


@dataclass
class ToolCatalog:
    """Tools by id, with a content hash as the catalog's version."""

    tools: dict[str, Tool]
    version: str
    source: str = ""
    _order: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tools)

    def name(self, tool_id: str) -> str:
        """The tool's display name; its id when the catalog does not know it."""
        tool = self.tools.get(tool_id)
        return tool.name if tool else tool_id

    def describe(self, tool_id: str) -> dict[str, Any] | None:
        """``{id, name, description, input_schema}`` of a tool, or None when the catalog lacks it."""
        tool = self.tools.get(tool_id)
        if tool is None:
            return None
        return {
            "id": tool.id,
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.json_schema(),
        }

    def lookup(self, key: str) -> list[dict[str, Any]]:
        """The tool with id ``key``, else every tool whose display name is ``key``, in catalog order.

        Two servers' tools can share a name (``github/search``, ``slack/search``): all of them come
        back, so a caller can refuse to guess which one an agent meant.
        """
        if key in self.tools:
            return [self.describe(key)]
        return [self.describe(t) for t in self._order if self.tools[t].name == key]

    @classmethod
    def from_records(cls, records: list[dict], source: str = "") -> ToolCatalog:
        tools = {str(r["_id"]): tool_from_record(r) for r in records}
        return cls(tools=tools, version=records_version(records), source=source, _order=list(tools))


def records_version(records: list[dict]) -> str:
    """The content hash that versions a catalog (:attr:`ToolCatalog.version`)."""
    return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()[:12]


def read_corpus_records(path: str, storage_options: dict[str, Any] | None = None) -> list[dict]:
    """Corpus records of a raw BEIR dir (``corpus.jsonl``) or a prepared dir, in corpus order.

    Only the corpus is read: a server needs no queries or qrels. Unparsable lines are skipped here
    because ``toolscout preprocess`` is where rejects are reported.
    """
    if is_prepared(path, storage_options):
        rows = sorted(read_table(path, "corpus", storage_options), key=lambda r: r["order"])
        return [
            {
                "_id": r["id"],
                "title": r["title"],
                "text": r["raw"],
                "metadata": json.loads(r.get("metadata") or "{}"),
            }
            for r in rows
        ]
    # The loader's own line and row rules (split on "\n" only, a byte-order mark dropped, the
    # record normalised as the prepared table holds it): str.splitlines also split inside a
    # description at U+2028 or U+0085, and a BOM made the first line unparsable, so those tools
    # were served by neither the catalog nor the retriever that trained on them.
    records = []
    for line in split_lines(io.read_bytes(io.join(path, "corpus.jsonl"), storage_options)):
        record = parse_record(line.text)[0] if line.text and line.text.strip() else None
        if record is not None:
            records.append(record)
    return records


def catalog_version(path: str, storage_options: dict[str, Any] | None = None) -> str:
    """The version :func:`load_catalog` would give, without parsing the tools (the driver only
    needs it to tell replicas when to reload)."""
    return records_version(read_corpus_records(path, storage_options))


def load_catalog(path: str, storage_options: dict[str, Any] | None = None) -> ToolCatalog:
    """The catalog of the dataset at ``path``."""
    return ToolCatalog.from_records(read_corpus_records(path, storage_options), source=path)
