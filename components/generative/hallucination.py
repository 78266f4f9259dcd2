"""Free (unconstrained) decoding with ``generate``, constrained outputs, and the hallucination rate.

ToolGen (arXiv 2410.03439, Sec. 5) measures how often a generative retriever names a tool that
does not exist, with and without constrained decoding. Free decoding is Hugging Face's beam search
with nothing in its way; constrained decoding is the project's one trie decoder
(:func:`components.generative.constrained.constrained_top_k`), whose hits become the same
:class:`Output` records (:func:`hits_to_outputs`). Each free sequence is parsed: it is a real tool
if its tokens are exactly a tool's code, if its text is a tool's token string or name, or else if
it begins with a tool's whole code (the agent stage teaches a tool token followed by
``\nAction Input: ...``, so a beam that names a tool often goes on). A beam that ends before it
names anything (nothing, or only whitespace, before the end of sequence) is empty, neither a tool
nor a hallucination (:func:`empty_rate`).
"""

from __future__ import annotations

import logging
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from components.generative.constrained import Hits
from components.generative.tool_tokens import ToolCodebook

log = logging.getLogger(__name__)


@dataclass
class Output:
    """One generated sequence: its tokens after the prompt, beam score, the tool it names (or None)
    and whether it is empty (named nothing: no tokens, or only whitespace, before the end; judged
    from ``tokens`` alone when not given)."""

    tokens: list[int]
    score: float
    tool: str | None
    empty: bool | None = None

    def __post_init__(self) -> None:
        if self.empty is None:
            self.empty = self.tool is None and not self.tokens


class OutputParser:
    """Maps generated tokens to a real tool id, or ``None`` for a hallucinated output.

    Args:
        codebook: Tool codes.
        tokenizer: To decode outputs that are not an exact code.
        names: Tool id -> human-readable name, for every tool of the catalog (no other tool is
            real); an output whose text equals a name (case-folded) or a tool's token string also
            counts as that tool. A name held by several tools counts as none of them.
    """

    def __init__(
        self, codebook: ToolCodebook, tokenizer: PreTrainedTokenizerBase, names: Mapping[str, str]
    ) -> None:
        self.codebook = codebook
        self.tokenizer = tokenizer
        self.stop = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
        self.catalog = set(names)
        holders: dict[str, list[str]] = {}
        for t, n in names.items():
            holders.setdefault(n.strip().casefold(), []).append(t)
        # A name two tools share identifies neither: crediting it to one of them (the dict's last,
        # as before) is arbitrary, so such a text names no tool; each tool's token string below
        # is unique and still names it.
        shared = {n: ts for n, ts in holders.items() if len(ts) > 1}
        if shared:
            example = next(iter(shared.items()))
            log.warning(
                "%d tool names are shared by several tools (e.g. %r: %s); an output spelling such a "
                "name is credited to none of them",
                len(shared),
                example[0],
                ", ".join(example[1]),
            )
        self.by_text = {n: ts[0] for n, ts in holders.items() if len(ts) == 1}
        for tool, code in codebook.codes.items():
            self.by_text[tokenizer.decode(list(code)).strip().casefold()] = tool

    def strip(self, tokens: Sequence[int]) -> list[int]:
        """Tokens up to the first end-of-sequence or padding token."""
        out = []
        for t in tokens:
            if int(t) in self.stop:
                break
            out.append(int(t))
        return out

    def empty(self, tokens: Sequence[int]) -> bool:
        """Whether an output names nothing: no tokens before the end, or only whitespace. A beam
        that writes a newline and stops tried no tool name, so it is no hallucination either."""
        tokens = self.strip(tokens)
        return self.codebook.tool_of(tokens) is None and not self.tokenizer.decode(tokens).strip()

    def output(self, tokens: Sequence[int], score: float) -> Output:
        """One generated sequence as an :class:`Output`, parsed."""
        tool = self.tool(tokens)
        return Output(self.strip(tokens), score, tool, empty=tool is None and self.empty(tokens))

    def tool(self, tokens: Sequence[int]) -> str | None:
        tokens = self.strip(tokens)
        found = self.codebook.tool_of(tokens)
        if found is None and tokens:
            found = self.by_text.get(self.tokenizer.decode(tokens).strip().casefold())
        if found is None:
            # Credited only as a whole output before, a beam naming a tool and going on (as the
            # agent stage's format does) counted as a hallucination and its tool was dropped.
            found = self.codebook.tool_at_start(tokens)
        # The catalog is the tools ``names`` lists: a codebook may hold more (a method indexed on a
        # narrower catalog keeps every trained code), and naming one of those is naming no tool here.
        return found if found in self.catalog else None


@torch.no_grad()
def generate_outputs(
    lm: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Sequence[int]],
    parser: OutputParser,
    num_beams: int,
    max_new_tokens: int,
    batch_size: int = 32,
) -> list[list[Output]]:
    """``num_beams`` free beams per prompt from ``lm.generate`` (prompts left-padded per batch:
    ``generate`` continues every row from the same column)."""
    lm.eval()
    device = next(lm.parameters()).device
    pad = tokenizer.pad_token_id
    eos = tokenizer.eos_token_id
    out: list[list[Output]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        generated = lm.generate(
            input_ids=ids,
            attention_mask=mask,
            num_beams=num_beams,
            num_return_sequences=num_beams,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=eos,
            output_scores=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
        sequences = generated.sequences[:, width:].tolist()
        # Scores rank the outputs of one call; they are not on one scale across decoding modes:
        # beam scores are length-normalised by generate (length_penalty 1.0), greedy ones are
        # raw sums, like constrained_top_k's.
        if num_beams > 1:
            scores = generated.sequences_scores.tolist()
        else:  # greedy: the summed log-probabilities of the generated tokens, up to the end
            steps = lm.compute_transition_scores(generated.sequences, generated.logits, normalize_logits=True)
            scores = [
                float(steps[r, : max(1, len(parser.strip(sequences[r])))].sum()) for r in range(len(chunk))
            ]
        for row in range(len(chunk)):
            beams = range(row * num_beams, (row + 1) * num_beams)
            out.append([parser.output(sequences[b], scores[b]) for b in beams])
    return out


def hits_to_outputs(hits: list[Hits], codebook: ToolCodebook) -> list[list[Output]]:
    """The constrained decoder's hits as outputs: each names the tool whose code it spelled."""
    return [[Output(list(codebook.codes[tool]), score, tool) for tool, score in row] for row in hits]


def hallucination_rate(outputs: Sequence[Sequence[Output]], catalog: Container[str] | None = None) -> float:
    """Share of generated sequences that name something that is no real tool (an empty sequence
    names nothing: :func:`empty_rate`; the two and the share naming a tool add up to 1). With
    ``catalog``, a tool outside it counts as no real tool too (the retrain gate's catalog)."""
    flat = [o for beams in outputs for o in beams]
    named = [o.tool for o in flat if not o.empty]
    invented = sum(t is None or (catalog is not None and t not in catalog) for t in named)
    return invented / max(len(flat), 1)


def empty_rate(outputs: Sequence[Sequence[Output]]) -> float:
    """Share of generated sequences that ended before naming anything (end of sequence first, or
    after whitespace only)."""
    flat = [o for beams in outputs for o in beams]
    return sum(bool(o.empty) for o in flat) / max(len(flat), 1)


def outputs_to_results(
    qids: Sequence[str], outputs: Sequence[Sequence[Output]], k: int
) -> dict[str, dict[str, float]]:
    """Retrieval results from generated beams (best first): the first ``k`` real tools, each at
    its best beam score. More beams than ``k`` are generated (at least ``num_beams``), so without
    the cut a top-``k`` answer could hold up to ``num_beams`` tools."""
    results: dict[str, dict[str, float]] = {}
    for qid, beams in zip(qids, outputs, strict=True):
        ranked: dict[str, float] = {}
        for o in beams:
            if len(ranked) == k:
                break
            if o.tool is not None and o.tool not in ranked:
                ranked[o.tool] = o.score
        results[qid] = ranked
    return results
