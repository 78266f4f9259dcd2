"""The token layout of a tool call for the local LM selector, shared by training and decoding.

A call is written as separately tokenized pieces::

    <s> request: {query}\\ntool:  | {tool name} </s> | {param} = | {value} </s> | {param} = | ...

Each piece is tokenized on its own and the ids are concatenated, both when building training
targets and when decoding, so the model sees at training time exactly the token boundaries the
constrained decoder forces (a BPE merge across a piece boundary cannot make the two disagree).
``</s>`` ends the tool name and each value. Only required parameters are written, in schema order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from components.serving.catalog import Param, Tool

PROMPT = "request: {query}\ntool:"


@dataclass
class CallFormat:
    """Piece encoders over one tokenizer."""

    tokenizer: PreTrainedTokenizerBase

    @property
    def end(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt(self, query: str, limit: int | None = None) -> list[int]:
        """The prompt's ids, at most ``limit`` of them: a longer one loses the start of its text,
        never BOS or the ``tool:`` cue the call follows (the end of a request names its values)."""
        bos = self.tokenizer.bos_token_id
        head = [bos] if bos is not None else []
        body = self.encode(PROMPT.format(query=query.strip()))
        if limit is not None and len(head) + len(body) > limit:
            body = body[len(body) - max(1, limit - len(head)) :]
        return head + body

    def name(self, tool: Tool) -> list[int]:
        """The tool's name then ``</s>``: the sequences the candidate trie holds."""
        return [*self.encode(" " + tool.name), self.end]

    def key(self, param: Param) -> list[int]:
        return self.encode(f" {param.name} =")

    def value(self, value: Any) -> list[int]:
        return [*self.encode(" " + format_value(value)), self.end]

    def target(self, tool: Tool, arguments: dict[str, Any]) -> list[int]:
        """Everything after the prompt for a call of ``tool`` with ``arguments``."""
        ids = self.name(tool)
        for param in tool.call_params():
            if param.name in arguments:
                ids += self.key(param) + self.value(arguments[param.name])
        return ids


def format_value(value: Any) -> str:
    """Argument values as the LM writes them: booleans in JSON spelling, floats positionally.

    ``str(1e-05)`` or ``str(1e+16)`` would use an exponent the number grammar of
    :mod:`.selector_lm` cannot spell; the shortest positional form (``2.5``, ``250``) always fits.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return np.format_float_positional(value, trim="-")
    return str(value)
