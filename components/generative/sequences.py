"""Training sequences of code-generating LMs: warm-up text, memorization, retrieval, agent steps.

ToolGen (arXiv 2410.03439, Sec. 3.2) fine-tunes in three stages: *memorization* (tool document ->
its tool token), *retrieval* (query -> the tokens of the tools it needs) and *end-to-end agent
tuning* (ReAct trajectories whose actions are tool tokens). ToolLens has no recorded trajectories,
so they are built here from each training query's tools and their parameter schemas:

    Query: <query>
    Thought: I need to <what the tool does>.
    Action: <<tool&&api>>
    Action Input: {"param": "<type>"}        (required params; values are typed placeholders)
    ... one step per tool ...
    Thought: I have what I need.
    Action: Finish</s>

ToolWeaver (arXiv 2601.21947) trains on the same sequences with a multi-token code in place of
the tool token. Prompts are built by one function per format, used both in training and at inference, so the
model always sees the same cue before a tool position.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence

from transformers import PreTrainedTokenizerBase

from components.data.tooltext import ToolRecord, parse_tool_text, tool_document
from components.data.types import Corpus, Dataset, Qrels
from components.generative.targeted import LMExample
from components.generative.tool_tokens import ToolCodebook

TOOL_CUE = "\nTool:"
FINISH = "\nThought: I have what I need.\nAction: Finish"
# Validation's thought before each action: the training thoughts begin the next tool's description.
BLIND_THOUGHT = "I need another tool for this query."


def tool_records(corpus: Corpus, ids: Iterable[str]) -> dict[str, ToolRecord]:
    """Parsed tool documents by id."""
    return {t: parse_tool_text(t, corpus[t]["text"]) for t in ids}


def tool_names(corpus: Corpus, ids: Iterable[str]) -> dict[str, str]:
    """Tool id -> ``"tool / api"`` name (what a tool token is spelled and initialised from)."""
    return {t: r.name for t, r in tool_records(corpus, ids).items()}


class Prompter:
    """Token sequences for each format, bound to one tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        self.eos = tokenizer.eos_token_id

    def text(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt(self, body: str, cue: str, max_length: int) -> list[int]:
        """BOS + ``body`` (cut to fit) + ``cue``: truncation never drops the cue the output follows."""
        cue_ids = self.text(cue)
        return self.bos + self.text(body)[: max(1, max_length - len(self.bos) - len(cue_ids))] + cue_ids

    def retrieval(self, query: str, max_length: int) -> list[int]:
        return self.prompt(f"Query: {query}", TOOL_CUE, max_length)

    def memorization(self, document: str, max_length: int) -> list[int]:
        return self.prompt(f"Tool document: {document}", TOOL_CUE, max_length)


def memorization_examples(
    prompter: Prompter, documents: Mapping[str, str], codebook: ToolCodebook, max_length: int
) -> list[LMExample]:
    """Stage 1: each tool's document -> its code, then end of sequence."""
    return [
        LMExample.continuation(prompter.memorization(doc, max_length), [*codebook.codes[t], prompter.eos])
        for t, doc in documents.items()
    ]


def relevant(rel: Mapping[str, int], codebook: ToolCodebook) -> list[str]:
    return [t for t, s in rel.items() if s > 0 and t in codebook]


def retrieval_examples(
    prompter: Prompter, queries: Mapping[str, str], qrels: Qrels, codebook: ToolCodebook, max_length: int
) -> list[LMExample]:
    """Stage 2: query -> each relevant tool's code.

    With single-token codes a query is one sequence whose tool position targets every relevant
    tool (the loss of all (query, tool) pairs at one forward pass); it ends with the first tool and
    end of sequence so that free generation learns to stop. Longer codes get one sequence per pair.
    """
    out = []
    for qid, rel in qrels.items():
        tools = relevant(rel, codebook)
        if not tools:
            continue
        prompt = prompter.retrieval(queries[qid], max_length)
        if codebook.max_length == 1:
            example = LMExample.continuation(prompt, [*codebook.codes[tools[0]], prompter.eos])
            example.targets[1:1] = [(len(prompt) - 1, codebook.codes[t][0]) for t in tools[1:]]
            out.append(example)
        else:
            out += [LMExample.continuation(prompt, [*codebook.codes[t], prompter.eos]) for t in tools]
    return out


def thought(record: ToolRecord, max_words: int = 12) -> str:
    """A short ReAct thought for calling a tool: what it does, from its description."""
    words = (record.description or record.api or record.tool).split()
    text = " ".join(words[:max_words]).rstrip(".,;:")
    return f"I need to use this: {text}." if text else "I need another tool."


def arguments(record: ToolRecord) -> str:
    """An ``Action Input`` following the tool's required-parameter schema, with typed placeholders."""
    args = {
        p.get("name", "") or f"arg{i}": f"<{(p.get('type') or 'value').lower()}>"
        for i, p in enumerate(record.required_params)
    }
    return json.dumps(args)


def agent_trajectory(
    prompter: Prompter,
    query: str,
    tools: Sequence[str],
    records: Mapping[str, ToolRecord],
    codebook: ToolCodebook,
    max_length: int,
    blind: bool = False,
) -> tuple[LMExample, list[int]]:
    """Stage 3: one ReAct trajectory; returns it and the positions that predict a tool code's first token.

    Every token after the query is a target (thoughts, actions, arguments, the final Finish).
    ``blind``: every thought is :data:`BLIND_THOUGHT`, not the start of the next tool's description
    (validation: there the description would give the answer away).
    """
    ids = prompter.prompt(f"Query: {query}", "", max_length)
    start, tool_positions = len(ids), []
    for t in tools:
        said = BLIND_THOUGHT if blind else thought(records[t])
        ids += prompter.text(f"\nThought: {said}\nAction:")
        tool_positions.append(len(ids) - 1)
        ids += [*codebook.codes[t], *prompter.text(f"\nAction Input: {arguments(records[t])}")]
    ids += [*prompter.text(FINISH), prompter.eos]
    ids = ids[: max(max_length, start + 1)]
    example = LMExample(ids, [(p, ids[p + 1]) for p in range(start - 1, len(ids) - 1)])
    return example, [p for p in tool_positions if p < len(ids) - 1]


def agent_examples(
    prompter: Prompter,
    data: Dataset,
    split: str,
    codebook: ToolCodebook,
    max_length: int,
    limit: int | None = None,
    seed: int = 0,
    blind: bool = False,
) -> list[tuple[LMExample, list[int], list[str]]]:
    """Trajectories of ``split``'s queries (a seeded sample of ``limit``), multi-tool queries first.

    Multi-tool queries are the ones that make a trajectory (several actions in a row), so a sample
    takes them before single-tool ones. Returns (example, tool positions, gold tools in order).
    ``blind``: thoughts that do not describe the next tool (see :func:`agent_trajectory`).
    """
    # A codebook carried over from an earlier LM (lm.name_or_path a ToolGen bundle) may hold tools
    # the corpus has dropped since: they have no document, and no query's qrels name them.
    records = tool_records(data.corpus, [t for t in codebook.codes if t in data.corpus])
    qids = [q for q, rel in data.qrels[split].items() if relevant(rel, codebook)]
    random.Random(seed).shuffle(qids)
    qids.sort(key=lambda q: -len(relevant(data.qrels[split][q], codebook)))  # stable: shuffled within ties
    out = []
    for qid in qids[:limit] if limit else qids:
        tools = relevant(data.qrels[split][qid], codebook)
        example, positions = agent_trajectory(
            prompter, data.queries[qid], tools, records, codebook, max_length, blind
        )
        out.append((example, positions, tools[: len(positions)]))
    return out


def tool_documents(corpus: Corpus, ids: Iterable[str], fields: Sequence[str]) -> dict[str, str]:
    """The memorization inputs: each tool's parsed fields as one text."""
    return {t: tool_document(corpus[t], list(fields)) for t in ids}


def warmup_texts(
    data: Dataset, tools: Sequence[str], fields: Sequence[str], limit: int | None, seed: int
) -> list[str]:
    """Plain text for the LM warm-up: every known tool document and a seeded sample of train queries."""
    queries = [data.queries[q] for q in data.qrels["train"]]
    random.Random(seed).shuffle(queries)
    return list(tool_documents(data.corpus, tools, fields).values()) + queries[:limit]
