"""A local causal LM that picks one retrieved candidate and fills its arguments, under constraints.

Decoding is greedy and constrained token by token (as in constrained generative retrieval, De Cao
et al., 2021, "Autoregressive Entity Retrieval"; ToolGen, arXiv 2410.03439):

- the tool name follows a prefix trie over the *retrieved candidates'* names
  (:class:`components.generative.trie.TokenTrie`), so the LM can only name a candidate;
- parameter keys are forced in schema order (required parameters only);
- each value is generated under a type constraint: numbers follow a small grammar
  (:class:`NumberGrammar`: an optional ``-``, digits, and for ``number`` at most one ``.`` followed
  by digits), booleans spell ``true``/``false``, strings take any printable token; ``</s>`` ends a
  value once it is complete (a string after one token, a number after a digit).

Forced tokens are fed without being scored, and the KV cache is reused across steps, so a call
costs one forward pass per *decision*, not per token. The arguments object is assembled from
the typed values, so it is valid JSON with the schema's required keys and base types; it is then
checked against the tool's whole schema (enums, nested shapes), and a call that breaks it is none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from components.generative import deadline
from components.generative.constrained import constrained_top_k
from components.generative.lm import load_causal_lm
from components.generative.targeted import TargetedLM
from components.generative.trie import TokenTrie
from components.serving.callformat import CallFormat
from components.serving.catalog import Tool, ToolCatalog

# States of the number grammar  -?[0-9]+(\.[0-9]+)?  as a value is decoded token by token.
N_STATES = 6
START, SPACED, SIGN, INT, DOT, FRAC = range(N_STATES)
ACCEPTING = (INT, FRAC)  # states in which the value may end
_NUMBER_CHARS = frozenset(" -.0123456789")

logger = logging.getLogger(__name__)


def number_step(state: int, text: str, decimal: bool) -> int | None:
    """The grammar state after a token that decodes to ``text``, or None if it breaks the grammar.

    Only the value's first token may carry the word-initial space (:class:`CallFormat` writes
    ``" " + value``); ``.`` needs a digit before it and only ``decimal`` (``number``) allows it.
    """
    if not text:
        return None
    if state == START and text[0] == " ":
        text, state = text[1:], SPACED
    for c in text:
        if c in "0123456789":  # not str.isdigit(): it also accepts "²" or "٣", which int() rejects
            state = FRAC if state in (DOT, FRAC) else INT
        elif c == "-" and state in (START, SPACED):
            state = SIGN
        elif c == "." and decimal and state == INT:
            state = DOT
        else:
            return None
    return state


class NumberGrammar:
    """Token transitions of the number grammar over a vocabulary.

    Args:
        texts: Each token id's decoded text ("" for specials).
        decimal: ``number`` (a fraction allowed) rather than ``integer``.
    """

    def __init__(self, texts: list[str], decimal: bool) -> None:
        self.next = torch.full((N_STATES, len(texts)), -1, dtype=torch.long)
        for token, text in enumerate(texts):
            if text and set(text) <= _NUMBER_CHARS:  # the rest can never fit: skip the state loop
                for state in range(N_STATES):
                    after = number_step(state, text, decimal)
                    if after is not None:
                        self.next[state, token] = after
        # Both masks per state, once: decoding looks one row up per generated token.
        self.ok = self.next >= 0
        self.completes = torch.isin(self.next, torch.tensor(ACCEPTING))

    def allowed(self, state: int, finish: bool = False) -> torch.Tensor:
        """Tokens that may follow ``state``; with ``finish``, only those that complete a number.
        A row of a shared table: clone it before changing it."""
        return (self.completes if finish else self.ok)[state]

    def step(self, state: int, token: int) -> int:
        return int(self.next[state, token])


class TypeMasks:
    """The tokens allowed in a value of each JSON type: a mask for strings, a grammar for numbers."""

    def __init__(self, tokenizer: Any, size: int) -> None:
        specials = set(tokenizer.all_special_ids)
        texts = [
            tokenizer.decode([i]) if i < len(tokenizer) and i not in specials else "" for i in range(size)
        ]
        self.string = torch.tensor([bool(t) and all(c >= " " for c in t) for t in texts])
        self.numbers = {
            "integer": NumberGrammar(texts, decimal=False),
            "number": NumberGrammar(texts, decimal=True),
        }


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
            deadline.check()  # the deployment stopped waiting (its deadline_s): decode no further
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
        """Spell one short sequence of ``trie`` greedily (a value such as true/false); returns it."""
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

    # Decoding is compute-bound: a batch's requests are decoded one after the other.
    concurrent_calls = False

    def __init__(self, model: str, catalog: ToolCatalog, max_value_tokens: int = 12) -> None:
        self.model, self.tokenizer = load_causal_lm(model)
        self.model.eval()
        self._scorer = TargetedLM(self.model)  # logits at chosen positions, for the trie decoder
        self.catalog = catalog
        self.fmt = CallFormat(self.tokenizer)
        self.max_value_tokens = max_value_tokens
        size = self.model.get_output_embeddings().weight.shape[0]
        self.masks = TypeMasks(self.tokenizer, size)
        self._names: dict[str, list[int]] = {}  # tokenized names by name: a name always tokenizes alike
        self._rooms: dict[str, int] = {}  # call length bound by tool id (see _call_room)
        self._booleans = TokenTrie([(self.fmt.value(True), "true"), (self.fmt.value(False), "false")])

    def _call_room(self, tool: Tool) -> int:
        """Tokens the longest call of ``tool`` can take: its name, then each key and value (cached:
        asked for every candidate of every request)."""
        if tool.id not in self._rooms:
            keys = sum(len(self.fmt.key(p)) + self.max_value_tokens + 1 for p in tool.call_params())
            self._rooms[tool.id] = len(self._name_ids(tool)) + keys
        return self._rooms[tool.id]

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
        if kind in self.masks.numbers:
            text = self._number(decoder, self.masks.numbers[kind])
            return float(text) if "." in text else int(text)
        text = self._string(decoder)
        return [text] if kind == "array" else text

    def _spell(
        self,
        decoder: _Decoder,
        mask_at: Callable[[int], torch.Tensor],
        advance: Callable[[int], None] = lambda token: None,
    ) -> str:
        """One value: at step ``i`` the best token under ``mask_at(i)`` (which decides whether
        ``</s>`` may end it there), ``advance`` told each kept token, until ``</s>`` or the budget."""
        ids: list[int] = []
        end = self.fmt.end
        for step in range(self.max_value_tokens):
            token = decoder.pick(mask_at(step))
            decoder.push([token])
            if token == end:
                break
            ids.append(token)
            advance(token)
        else:
            decoder.push([end])  # close the value as in training
        return self.tokenizer.decode(ids).strip()

    def _string(self, decoder: _Decoder) -> str:
        """Printable tokens until ``</s>`` (at least one) or the token budget."""

        def mask_at(step: int) -> torch.Tensor:
            mask = self.masks.string.clone()
            mask[self.fmt.end] = step > 0  # a value is never empty
            return mask

        return self._spell(decoder, mask_at)

    def _number(self, decoder: _Decoder, grammar: NumberGrammar) -> str:
        """A number spelled under ``grammar``; the last token of the budget must complete it."""
        state = START

        def mask_at(step: int) -> torch.Tensor:
            mask = grammar.allowed(state, finish=step == self.max_value_tokens - 1).clone()
            mask[self.fmt.end] = state in ACCEPTING
            if not bool(mask.any()):
                raise ValueError("the vocabulary cannot complete a number within max_value_tokens")
            return mask

        def advance(token: int) -> None:
            nonlocal state
            state = grammar.step(state, token)

        return self._spell(decoder, mask_at, advance)

    @torch.inference_mode()
    def select(self, query: str, history: list[str], candidates: list[str]) -> dict[str, Any] | None:
        """``{"tool", "arguments"}`` for the best candidate, or ``None`` if no candidate is known.

        Raises:
            DeadlinePassed: a :func:`components.generative.deadline.deadline` passed while decoding.
        """
        deadline.check()
        trie = self.candidate_trie(candidates)
        if not len(trie):
            return None
        # The longest call among the candidates must fit after the prompt, within the model's
        # positions: a longer request loses the start of its text (as training cut it).
        room = max(self._call_room(self.catalog.tools[c]) for c in candidates if c in self.catalog.tools)
        positions = getattr(self.model.config, "max_position_embeddings", None) or 1 << 20
        prompt = self.fmt.prompt(query, max(2, positions - room))
        # The tool: the project's one constrained decoder over the candidates' names (each ends in
        # </s>, so none is a prefix of another), greedy with one beam: an unknown name is impossible.
        (tool_id, _), *_ = constrained_top_k(
            self._scorer, [prompt], trie, 1, self.tokenizer.pad_token_id, num_beams=1
        )[0]
        deadline.check()  # the name's beam search ran its forward passes: before the arguments'
        decoder = _Decoder(self.model, prompt)
        # The chosen name (as the candidate trie spelled it), forced, then its arguments.
        decoder.push(self._name_ids(self.catalog.tools[tool_id]))
        tool = self.catalog.tools[tool_id]
        arguments: dict[str, Any] = {}
        for param in tool.call_params():
            decoder.push(self.fmt.key(param))
            arguments[param.name] = self._value(decoder, param.type)
        # The grammar holds keys and base types, not what else a tool's own schema asks (an enum,
        # an object's fields, an array's item type): a call it breaks is no call, as from the other
        # selectors, rather than one the agent would run and see fail.
        problem = tool.argument_errors(arguments)
        if problem:
            logger.info("no call: the decoded arguments break the tool's schema: %s", problem)
            return None
        return {"tool": tool_id, "arguments": arguments}
