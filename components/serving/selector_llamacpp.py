"""Selection by a GGUF model under llama.cpp, decoding bound to a grammar of the candidates' calls.

The CPU engine for the selector slot (:mod:`components.generative.llamacpp`). The retrieved
candidates are listed in the prompt, and decoding follows a GBNF grammar built from one JSON
Schema: ``oneOf`` the candidates, each ``{"tool": <its id, a constant>, "arguments": <its required
parameters, typed>}`` (llama.cpp's JSON-Schema-to-grammar converter). The model can therefore only
write a call of an offered tool with its required arguments of the right types, as the trie and
type masks of :mod:`.selector_lm` guarantee for a Hugging Face LM; the answer is still checked
here, as :mod:`.selector_http` checks an endpoint's.
"""

from __future__ import annotations

import json
from typing import Any

from components.generative.llamacpp import LlamaCppLM, json_schema_grammar
from components.generative.text import fit_request
from components.serving.catalog import Tool, ToolCatalog, json_type

SYSTEM = (
    "You route a user's request to exactly one of the offered tools and fill its arguments from the "
    'request. Answer with one JSON object: {"tool": <tool id>, "arguments": {...}}.'
)
# A JSON type the converter knows for each parameter type; strings and arrays are bounded so that a
# rambling value cannot run past the token budget and leave the JSON unfinished. A value that
# reaches a bound may have been cut there: :meth:`LlamaCppSelector.parse` answers no call then.
MAX_CHARS = 120
CHAT_OVERHEAD = 32  # tokens the chat template adds around the system and user turns
MAX_ITEMS = 8
_VALUE_SCHEMAS: dict[str, dict[str, Any]] = {
    "string": {"type": "string", "maxLength": MAX_CHARS},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "object": {"type": "object"},
}


def value_schema(kind: str, own: dict[str, Any]) -> dict[str, Any]:
    """The grammar's schema of one argument: its base type, with what the tool's own property
    schema ``own`` says of an enum and of an array's items (an array of integers is one)."""
    enum = own.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str | int | float | bool) for v in enum):
        return {"enum": enum}
    if kind == "array":
        items = own.get("items") if isinstance(own.get("items"), dict) else {}
        item = value_schema(json_type(items.get("type")), items)
        return {"type": "array", "items": item, "maxItems": MAX_ITEMS}
    return _VALUE_SCHEMAS.get(kind, _VALUE_SCHEMAS["string"])


def arguments_schema(tool: Tool) -> dict[str, Any]:
    """The tool's required parameters as a closed JSON Schema object, in schema order."""
    own = (tool.input_schema or {}).get("properties") or {}
    properties = {
        p.name: value_schema(p.type, own.get(p.name) if isinstance(own.get(p.name), dict) else {})
        for p in tool.call_params()
    }
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def at_a_bound(value: Any) -> bool:
    """Whether ``value`` (or a value in it) reached the grammar's length bounds, so may be cut."""
    if isinstance(value, str):
        return len(value) >= MAX_CHARS
    if isinstance(value, list):
        return len(value) >= MAX_ITEMS or any(at_a_bound(v) for v in value)
    if isinstance(value, dict):
        return any(at_a_bound(v) for v in value.values())
    return False


def call_schema(tools: list[Tool]) -> dict[str, Any]:
    """One JSON Schema whose instances are exactly the calls of ``tools`` (``oneOf`` them)."""
    return {
        "oneOf": [
            {
                "type": "object",
                "properties": {"tool": {"const": t.id}, "arguments": arguments_schema(t)},
                "required": ["tool", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }


class LlamaCppSelector:
    """Picks a candidate and fills its required arguments with a GGUF model (greedy, grammar-bound).

    Args:
        catalog: Tools with their parameter schemas.
        model: ``smollm2-135m`` or a ``.gguf`` path (:class:`components.generative.llamacpp.LlamaCppLM`).
        n_threads: CPU threads (a replica given one CPU should say 1).
        max_tokens: Token budget of one call's JSON.
        weights: How the GGUF's weights run: ``file`` (as stored) or a re-encoding such as ``q8_0``
            (:data:`components.generative.llamacpp.WEIGHTS`).
    """

    # Decoding is compute-bound: a batch's requests are decoded one after the other.
    concurrent_calls = False

    def __init__(
        self,
        catalog: ToolCatalog,
        model: str = "smollm2-135m",
        n_threads: int | None = None,
        n_ctx: int = 2048,
        max_tokens: int = 160,
        weights: str = "file",
    ) -> None:
        self.catalog, self.max_tokens = catalog, max_tokens
        self.lm = LlamaCppLM(model=model, n_ctx=n_ctx, n_threads=n_threads, weights=weights)
        self.lm.llm()  # load in the replica's constructor, not on the first request

    def prompt(self, query: str, history: list[str], tools: list[Tool]) -> str:
        """The user turn: the offered tools (id, name, description, required parameters), then the request."""
        return f"{offer(tools)}\n{request_lines(query, history)}"

    def parse(self, text: str, tools: list[Tool]) -> dict[str, Any] | None:
        """The call in ``text``, or ``None`` if it is not a complete call of an offered tool."""
        try:
            # strict=False: the grammar llama.cpp builds from the schema lets a string hold a raw
            # line break or tab (its `char` is any character but `"` and `\\`), which strict JSON
            # refuses; such a call obeyed the grammar and is the model's answer.
            call = json.loads(text, strict=False)
        except json.JSONDecodeError:
            return None  # the token budget ran out mid-object
        offered = {t.id: t for t in tools}
        if not isinstance(call, dict) or call.get("tool") not in offered:
            return None
        arguments = call.get("arguments")
        tool = offered[call["tool"]]
        # The grammar knows required keys and base types only: the tool's own schema (an enum, a
        # range, an item type; required keys and an object too) is checked here.
        if tool.argument_errors(arguments) or at_a_bound(arguments):
            return None  # a value at a bound may be cut short: no call rather than a wrong one
        return {"tool": tool.id, "arguments": arguments}

    def select(self, query: str, history: list[str], candidates: list[str]) -> dict[str, Any] | None:
        """``{"tool", "arguments"}`` for the chosen candidate, or ``None`` if no candidate is known."""
        tools = [self.catalog.tools[c] for c in dict.fromkeys(candidates) if c in self.catalog.tools]
        if not tools:
            return None
        # The prompt and the answer must fit the context (top_k may be 50, a catalog's descriptions
        # long): the lowest-ranked candidates are left out until they do, not the request failed.
        llm = self.lm.llm()
        room = llm.n_ctx() - self.max_tokens - CHAT_OVERHEAD - len(llm.tokenize(SYSTEM.encode()))
        while len(tools) > 1 and len(llm.tokenize(self.prompt(query, history, tools).encode())) > room:
            tools = tools[:-1]
        # Still too long with one tool: the request itself is cut to its end (the latest turn and
        # the ask come last), as the rewriter cuts it; llama.cpp failed the request on it.
        head = offer(tools)
        request = fit_request(
            request_lines(query, history),
            lambda r: len(llm.tokenize(f"{head}\n{r}".encode())) <= room,
            lambda t: llm.tokenize(t.encode(), add_bos=False),
            lambda ids: llm.detokenize(ids).decode(errors="ignore"),
        )
        grammar = json_schema_grammar(call_schema(tools))
        text = self.lm.complete(SYSTEM, f"{head}\n{request}", self.max_tokens, grammar=grammar)
        return self.parse(text, tools)


def offer(tools: list[Tool]) -> str:
    """The prompt's tool list: id, name, description and required parameters of each."""
    lines = ["Tools:"]
    for t in tools:
        params = ", ".join(f"{p.name} ({p.type})" for p in t.call_params()) or "none"
        lines.append(f"- {t.id}: {t.name}. {t.description[:160]} Required: {params}.")
    return "\n".join(lines)


def request_lines(query: str, history: list[str]) -> str:
    """The prompt's request: the earlier turns, then the query."""
    return "\n".join([*(f"Earlier: {turn}" for turn in history), f"Request: {query}"])
