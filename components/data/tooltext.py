"""Parse ToolBench-style tool documents into fields.

ToolLens and the other ToolBench-derived corpora flatten each API into one string::

    category_name:Food, tool_name:Worldwide Recipes, api_name:Suggestions, api_description:Get ...,
    required_params: [{"name": "q", ...}], optional_params: [], return_schema: {...}

Descriptions contain commas and colons, so the parser anchors on the known keys, in order, rather
than splitting on separators.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from components.data.types import Corpus

KEYS = (
    "category_name",
    "tool_name",
    "api_name",
    "api_description",
    "required_params",
    "optional_params",
    "return_schema",
)
_KEY_RE = re.compile(r"(?:^|,\s*)(" + "|".join(KEYS) + r")\s*:\s*")


@dataclass
class ToolRecord:
    """One tool (API) with its parsed fields and the raw text it came from."""

    id: str
    raw: str
    category: str = ""
    tool: str = ""
    api: str = ""
    description: str = ""
    required_params: list[dict] = field(default_factory=list)
    optional_params: list[dict] = field(default_factory=list)
    return_schema: str = ""

    @property
    def name(self) -> str:
        """Human-readable name: ``tool / api`` when both exist."""
        parts = [p for p in (self.tool, self.api) if p]
        return " / ".join(parts) or self.id

    def to_row(self) -> dict:
        """A flat row for parquet (param lists as JSON strings)."""
        row = asdict(self)
        row["required_params"] = json.dumps(self.required_params)
        row["optional_params"] = json.dumps(self.optional_params)
        return row


def _parse_params(value: str) -> list[dict]:
    """A params list as JSON; anything unparsable is kept as one free-text entry, not dropped."""
    value = value.strip()
    if not value:
        return []
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return [{"name": "", "type": "", "description": value}]
    if isinstance(parsed, list):
        return [p if isinstance(p, dict) else {"name": str(p)} for p in parsed]
    return [parsed] if isinstance(parsed, dict) else [{"name": str(parsed)}]


def parse_tool_text(tool_id: str, text: str) -> ToolRecord:
    """Split a ToolBench-style tool document into its fields.

    Text that does not follow the format (a free-form description) becomes the description, so
    every corpus still yields a usable record.
    """
    matches = list(_KEY_RE.finditer(text))
    if not matches:
        return ToolRecord(id=tool_id, raw=text, description=text.strip())
    values: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        values.setdefault(m.group(1), text[m.end() : end].strip())
    return ToolRecord(
        id=tool_id,
        raw=text,
        category=values.get("category_name", ""),
        tool=values.get("tool_name", ""),
        api=values.get("api_name", ""),
        description=values.get("api_description", ""),
        required_params=_parse_params(values.get("required_params", "")),
        optional_params=_parse_params(values.get("optional_params", "")),
        return_schema=values.get("return_schema", ""),
    )


TOOL_FIELDS = ("category", "tool", "api", "description", "required_params", "optional_params")


def tool_field_names(fields: str | list[str] | tuple[str, ...], owner: str) -> tuple[str, ...]:
    """A method's ``tool_fields`` setting as a tuple of :class:`ToolRecord` field names, checked.

    Raises:
        ValueError: a name is not a field (a misspelling was accepted, and failed when training
            began), or the setting is empty.
    """
    # One name given as a string is one field: ``tuple("description")`` was its letters.
    names = (fields,) if isinstance(fields, str) else tuple(fields)
    unknown = [n for n in names if n not in ToolRecord.__dataclass_fields__]
    if unknown or not names:
        valid = sorted(ToolRecord.__dataclass_fields__)
        raise ValueError(f"{owner}: tool_fields {list(names)} are not all tool fields; choose from {valid}")
    return names


def tool_document(record: dict, fields: str | list[str] | tuple[str, ...] = "raw") -> str:
    """The text a retriever reads for a tool: the raw document, or chosen parsed fields.

    Parameter lists contribute their names and descriptions, not their JSON punctuation.
    """
    if fields == "raw":
        return " ".join(p for p in (record.get("title", ""), record["text"]) if p)
    if isinstance(fields, str):  # one field name, not a sequence of its characters
        fields = (fields,)
    tool = parse_tool_text(record["_id"], record["text"])
    parts = []
    for name in fields:
        if name not in ToolRecord.__dataclass_fields__:
            raise ValueError(f"unknown tool field {name!r}; use 'raw' or fields of ToolRecord")
        value = getattr(tool, name)
        if name.endswith("_params"):
            value = " ".join(f"{p.get('name', '')} {p.get('description', '')}".strip() for p in value)
        parts.append(str(value))
    return " ".join(p for p in parts if p)


def tool_texts(corpus: Corpus, ids: list[str], fields: tuple[str, ...]) -> list[str]:
    """The text each encoder reads for each tool id: the tool's document over ``fields``."""
    return [tool_document(corpus[t], list(fields)) for t in ids]
