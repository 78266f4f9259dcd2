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
from components.serving.catalog import Tool, ToolCatalog

SYSTEM = (
    "You route a user's request to exactly one of the offered tools and fill its arguments from the "
    'request. Answer with one JSON object: {"tool": <tool id>, "arguments": {...}}.'
)
# A JSON type the converter knows for each parameter type; strings are bounded so that a rambling
# value cannot run past the token budget and leave the JSON unfinished.
_VALUE_SCHEMAS: dict[str, dict[str, Any]] = {
    "string": {"type": "string", "maxLength": 48},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "array": {"type": "array", "items": {"type": "string", "maxLength": 48}, "maxItems": 4},
    "object": {"type": "object"},
}


def arguments_schema(tool: Tool) -> dict[str, Any]:
    """The tool's required parameters as a closed JSON Schema object, in schema order."""
    properties = {p.name: _VALUE_SCHEMAS.get(p.type, _VALUE_SCHEMAS["string"]) for p in tool.call_params()}
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


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
    ) -> None:
        self.catalog, self.max_tokens = catalog, max_tokens
        self.lm = LlamaCppLM(model=model, n_ctx=n_ctx, n_threads=n_threads)
        self.lm.llm()  # load in the replica's constructor, not on the first request

    def prompt(self, query: str, history: list[str], tools: list[Tool]) -> str:
        """The user turn: the offered tools (id, name, description, required parameters), then the request."""
        lines = ["Tools:"]
        for t in tools:
            params = ", ".join(f"{p.name} ({p.type})" for p in t.call_params()) or "none"
            lines.append(f"- {t.id}: {t.name}. {t.description[:160]} Required: {params}.")
        lines += [*(f"Earlier: {turn}" for turn in history), f"Request: {query}"]
        return "\n".join(lines)

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
        if tool.argument_errors(arguments):
            return None
        return {"tool": tool.id, "arguments": arguments}

    def select(self, query: str, history: list[str], candidates: list[str]) -> dict[str, Any] | None:
        """``{"tool", "arguments"}`` for the chosen candidate, or ``None`` if no candidate is known."""
        tools = [self.catalog.tools[c] for c in dict.fromkeys(candidates) if c in self.catalog.tools]
        if not tools:
            return None
        grammar = json_schema_grammar(call_schema(tools))
        text = self.lm.complete(SYSTEM, self.prompt(query, history, tools), self.max_tokens, grammar=grammar)
        return self.parse(text, tools)
