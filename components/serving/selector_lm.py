"""A local causal LM that picks one retrieved candidate and fills its arguments, under constraints.

Decoding is greedy and constrained token by token (as in constrained generative retrieval, De Cao
et al., 2021, "Autoregressive Entity Retrieval"; ToolGen, arXiv 2410.03439):

- the tool name follows a prefix trie over the *retrieved candidates'* names
  (:class:`components.generative.trie.TokenTrie`), so the LM can only name a candidate;
- parameter keys are forced in schema order (required parameters only);
- each value is generated under a type mask: digits for integer/number, ``true``/``false`` for
  booleans, any printable token for strings; ``</s>`` ends it (after at least one token).

Forced tokens are fed without being scored, and the KV cache is reused across steps, so a call
costs one forward pass per *decision*, not per token. The arguments object is assembled from
the typed values, so it is valid JSON that satisfies the schema's required keys and types.
"""

from __future__ import annotations

from typing import Any

import torch

from components.generative.lm import load_causal_lm
from components.generative.trie import TokenTrie
from components.serving.callformat import CallFormat
from components.serving.catalog import Tool, ToolCatalog


class TypeMasks:
    """Boolean masks over the vocabulary of the tokens allowed in a value of each JSON type."""

    def __init__(self, tokenizer: Any, size: int) -> None:
        specials = set(tokenizer.all_special_ids)
        texts = [
            tokenizer.decode([i]) if i < len(tokenizer) and i not in specials else "" for i in range(size)
        ]
        printable = [bool(t) and all(c >= " " for c in t) for t in texts]
        self.string = torch.tensor(printable)
        # A number's first token may carry the word-initial space; later tokens must be bare digits.
        # isascii(): str.isdigit() also accepts "²" or "٣", which int() then rejects.
        self.digits_first = torch.tensor([t.lstrip(" ").isdigit() and t.isascii() for t in texts])
        self.digits_next = torch.tensor([t.isdigit() and t.isascii() for t in texts])


class _Decoder:
    """Greedy decoding over one sequence with a KV cache; forced tokens wait until a decision."""

    def __init__(self, model: Any, prompt: list[int]) -> None:
        self.model = model
        self.past: Any = None
        self.pending = list(prompt)
        self.logits: torch.Tensor | None = None

    def push(self, ids: list[int]) -> None:
        self.pending.extend(ids)

    def _scores(self) -> torch.Tensor:
        if self.pending:
            out = self.model(
                input_ids=torch.tensor([self.pending]), past_key_values=self.past, use_cache=True
            )
            self.past, self.logits, self.pending = out.past_key_values, out.logits[0, -1], []
        assert self.logits is not None
        return self.logits

    def pick(self, allowed: list[int] | torch.Tensor) -> int:
        """The allowed token with the highest logit (a list of ids or a boolean mask)."""
        if isinstance(allowed, list):
            if len(allowed) == 1:
                return allowed[0]  # forced: no forward pass needed to decide it
            logits = self._scores()
            return allowed[int(torch.argmax(logits[allowed]))]
        logits = self._scores()
        return int(torch.argmax(logits.masked_fill(~allowed[: logits.shape[0]], float("-inf"))))

    def walk(self, trie: TokenTrie) -> str | None:
        """Spell one sequence of ``trie`` greedily; returns its value."""
        spelled: list[int] = []
        while allowed := trie.allowed(spelled):
            token = self.pick(allowed)
            spelled.append(token)
            self.push([token])
        return trie.value(spelled)


class LMSelector:
    """Constrained tool choice and argument filling with a causal LM (hub name or local dir).

    Args:
        model: A model dir written by :func:`components.serving.selector_train.train_selector_lm`
            (or any causal LM trained on :mod:`.callformat`'s layout).
        catalog: Tools with their parameter schemas.
        max_value_tokens: Longest value the LM may write for one parameter.
    """

    def __init__(self, model: str, catalog: ToolCatalog, max_value_tokens: int = 12) -> None:
        self.model, self.tokenizer = load_causal_lm(model)
        self.model.eval()
        self.catalog = catalog
        self.fmt = CallFormat(self.tokenizer)
        self.max_value_tokens = max_value_tokens
        size = self.model.get_output_embeddings().weight.shape[0]
        self.masks = TypeMasks(self.tokenizer, size)
        self._names: dict[str, list[int]] = {}  # tokenized names by name: a name always tokenizes alike
        self._booleans = TokenTrie([(self.fmt.value(True), "true"), (self.fmt.value(False), "false")])

    def _name_ids(self, tool: Tool) -> list[int]:
        if tool.name not in self._names:
            self._names[tool.name] = self.fmt.name(tool)
        return self._names[tool.name]

    def candidate_trie(self, candidates: list[str]) -> TokenTrie:
        """Names of the known candidates; of two tools with the same name the better-ranked one wins."""
        trie = TokenTrie()
        for tool_id in candidates:
            tool = self.catalog.tools.get(tool_id)
            if tool is not None and trie.value(ids := self._name_ids(tool)) is None:
                trie.insert(ids, tool_id)
        return trie

    def _value(self, decoder: _Decoder, kind: str) -> Any:
        if kind == "boolean":
            return decoder.walk(self._booleans) == "true"
        numeric = kind in ("integer", "number")
        ids: list[int] = []
        end = self.fmt.end
        for _ in range(self.max_value_tokens):
            mask = (
                (self.masks.digits_next if ids else self.masks.digits_first) if numeric else self.masks.string
            )
            mask = mask.clone()
            mask[end] = bool(ids)  # a value is never empty
            token = decoder.pick(mask)
            decoder.push([token])
            if token == end:
                break
            ids.append(token)
        else:
            decoder.push([end])  # close the value as in training
        text = self.tokenizer.decode(ids).strip()
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text) if "." in text else int(text)
        return [text] if kind == "array" else text

    @torch.inference_mode()
    def select(self, query: str, history: list[str], candidates: list[str]) -> dict[str, Any] | None:
        """``{"tool", "arguments"}`` for the best candidate, or ``None`` if no candidate is known."""
        trie = self.candidate_trie(candidates)
        if not len(trie):
            return None
        decoder = _Decoder(self.model, self.fmt.prompt(query))
        tool_id = decoder.walk(trie)
        assert tool_id is not None  # walk ends on a complete candidate name
        arguments: dict[str, Any] = {}
        for param in self.catalog.tools[tool_id].required:
            decoder.push(self.fmt.key(param))
            arguments[param.name] = self._value(decoder, param.type)
        return {"tool": tool_id, "arguments": arguments}
