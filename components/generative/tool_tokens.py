"""Tool virtualization: one new vocabulary token per tool (ToolGen's atomic indexing).

ToolGen (arXiv 2410.03439, Sec. 3.1) turns every tool into a single token such as
``<<Worldwide Recipes&&Suggestions>>`` and grows the LM's vocabulary and embedding tables by one row
per tool. Each new row starts as the mean of the embeddings of the tokens that spell the tool's
name, so a freshly added tool already sits near the words that describe it; this is also how tools
added after training become usable without retraining.

A tool's *code* is the token-id sequence that names it: length 1 here; ToolWeaver's
multi-token codes reuse :class:`ToolCodebook` with longer sequences.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from components.generative.trie import TokenTrie


def tool_token(name: str) -> str:
    """The token string of a tool: ``<<tool&&api>>`` as in ToolGen, whitespace folded to ``_``.

    Args:
        name: The tool's human-readable name, ``"tool / api"`` or just ``"tool"``.
    """
    parts = [re.sub(r"\s+", "_", p.strip()) for p in name.split(" / ")]
    return "<<" + "&&".join(p for p in parts if p) + ">>"


class ToolCodebook:
    """Tool id -> code (token-id sequence), with the prefix trie that constrains decoding to real tools.

    Args:
        codes: Tool id -> its token ids (length 1 for ToolGen's atomic tokens, longer for ToolWeaver).
    """

    def __init__(self, codes: Mapping[str, Sequence[int]] | None = None) -> None:
        self.codes: dict[str, tuple[int, ...]] = {}
        self._by_code: dict[tuple[int, ...], str] = {}
        self._lengths: list[int] | None = None  # tool_at_start's code lengths, longest first
        self._code_tokens: set[int] = set()
        for tool_id, code in (codes or {}).items():
            self.add(tool_id, code)  # two tools with one code are refused, not decoded as the last

    def recode(self, codes: Mapping[str, Sequence[int]]) -> None:
        """Replace every code at once with ``codes`` (a new quantizer's assignment): tool by tool,
        a tool taking a code another still held until its own turn (two tools swapping codes) was
        refused. Tools ``codes`` leaves out are dropped; a code named twice is refused."""
        fresh = ToolCodebook(codes)
        self.codes, self._by_code, self._lengths = fresh.codes, fresh._by_code, None

    def __len__(self) -> int:
        return len(self.codes)

    def __contains__(self, tool_id: object) -> bool:
        return tool_id in self.codes

    def add(self, tool_id: str, code: Sequence[int]) -> None:
        key = tuple(int(i) for i in code)
        if key in self._by_code and self._by_code[key] != tool_id:
            raise ValueError(f"code {key} already names tool {self._by_code[key]!r}, not {tool_id!r}")
        old = self.codes.get(tool_id)
        if old is not None and old != key:
            # A tool re-coded (a new quantizer's codes over a loaded codebook) frees its old code:
            # left behind, it would still decode to this tool and refuse another tool that code.
            del self._by_code[old]
        self.codes[tool_id] = key
        self._by_code[key] = tool_id
        self._lengths = None  # tool_at_start looks again

    def tool_of(self, code: Sequence[int]) -> str | None:
        """The tool a token sequence names exactly, else ``None`` (a hallucinated output)."""
        return self._by_code.get(tuple(int(i) for i in code))

    def tool_at_start(self, tokens: Sequence[int]) -> str | None:
        """The tool whose whole code ``tokens`` begin with, followed by text rather than another
        code token, else ``None``: what a freely generated sequence named before going on
        (``\nAction Input: ...``). Codes run into more code tokens (``<<A>><<B>>``, a ToolWeaver
        code and the start of another) name no one tool."""
        if self._lengths is None:  # one pass over the codes, not one per beam
            self._lengths = sorted({len(c) for c in self.codes.values()}, reverse=True)
            self._code_tokens = set(self.token_ids())
        for n in self._lengths:
            if n < len(tokens) and int(tokens[n]) not in self._code_tokens:
                found = self.tool_of(tokens[:n])
                if found is not None:
                    return found
        return None

    def trie(self, candidates: Iterable[str] | None = None) -> TokenTrie:
        """The decoding constraint over every tool, or narrowed to ``candidates`` (unknown ids ignored)."""
        tools = self.codes if candidates is None else [t for t in candidates if t in self.codes]
        return TokenTrie((self.codes[t], t) for t in tools)

    def token_ids(self) -> list[int]:
        """Every token id used by some code, sorted (the rows a tool stage must train)."""
        return sorted({i for code in self.codes.values() for i in code})

    @property
    def max_length(self) -> int:
        return max((len(c) for c in self.codes.values()), default=0)

    def to_json(self) -> dict[str, list[int]]:
        return {t: list(c) for t, c in self.codes.items()}

    @classmethod
    def from_json(cls, codes: Mapping[str, Sequence[int]]) -> ToolCodebook:
        return cls(codes)


def name_embedding_rows(
    table: torch.Tensor, tokenizer: PreTrainedTokenizerBase, names: Sequence[str]
) -> torch.Tensor:
    """For each name, the mean of the rows of ``table`` of the tokens that spell it.

    A name that tokenizes to nothing (empty) falls back to the mean of the whole table.
    """
    rows = []
    for name in names:
        ids = tokenizer(name, add_special_tokens=False)["input_ids"]
        rows.append(table[ids].mean(0) if ids else table.mean(0))
    return torch.stack(rows) if rows else table.new_zeros(0, table.shape[1])


def spoken_name(name: str) -> str:
    """A tool name as its embedding rows should read it: "tool / api" as "tool api" (the separator
    would add the same row to every mean)."""
    return " ".join(name.split(" / "))


def embedding_tables(model: PreTrainedModel) -> list[torch.Tensor]:
    """The input embedding table, and the output one when it is a separate (untied) table."""
    tables = [model.get_input_embeddings().weight]
    output_layer = model.get_output_embeddings()
    if output_layer is not None and output_layer.weight is not tables[0]:
        tables.append(output_layer.weight)
    return tables


def grow_tables(model: PreTrainedModel, tokens: int) -> None:
    """Give the embedding tables a row for each of ``tokens`` token ids, never fewer rows than now.

    New tokens take the ids after the tokenizer's last one, which in a table padded past the
    tokenizer (Qwen2.5) are padding rows already: resizing to ``len(tokenizer)`` would shrink such
    a table and cut rows off the output layer. The caller writes the new tokens' rows by id.
    """
    rows = model.get_input_embeddings().weight.shape[0]
    # mean_resizing=False: the callers overwrite the new rows, so skip HF's covariance sampling.
    model.resize_token_embeddings(max(rows, tokens), mean_resizing=False)


@torch.no_grad()
def add_tool_tokens(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    names: Mapping[str, str],
    codebook: ToolCodebook | None = None,
) -> ToolCodebook:
    """Give every tool in ``names`` (tool id -> name) a token, unless ``codebook`` already has it.

    New tokens are added to the tokenizer, the embedding tables are resized, and each new row (input
    embeddings, and output embeddings when they are not tied) is the mean of the rows of the
    tool's name tokens, computed before the resize so that earlier-added tool tokens never leak in.

    Returns:
        The codebook with every tool of ``names`` (one token each).
    """
    codebook = ToolCodebook() if codebook is None else codebook
    new = [t for t in names if t not in codebook]
    if not new:
        return codebook
    strings, taken = {}, set(tokenizer.get_vocab())
    for t in new:
        token = tool_token(names[t])
        # Two tools with one name (or a name that is already a token) still need distinct tokens.
        strings[t] = token if token not in taken else f"{token[:-2]}#{t}>>"
        taken.add(strings[t])
    spoken = [spoken_name(names[t]) for t in new]
    rows = [name_embedding_rows(t.detach(), tokenizer, spoken) for t in embedding_tables(model)]
    tokenizer.add_tokens(list(strings.values()))
    ids = tokenizer.convert_tokens_to_ids(list(strings.values()))
    grow_tables(model, len(tokenizer))
    for table, new_rows in zip(embedding_tables(model), rows, strict=True):
        table[ids] = new_rows
    for t, i in zip(new, ids, strict=True):
        codebook.add(t, (i,))
    return codebook


def code_token(level: int, code: int) -> str:
    """The token of code ``code`` at level ``level`` (0-based), ``<T1_17>`` style as in ToolWeaver."""
    return f"<T{level + 1}_{code}>"


@torch.no_grad()
def add_code_tokens(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, levels: int, size: int
) -> list[list[int]]:
    """Add ``levels`` × ``size`` shared code tokens (ToolWeaver, arXiv 2601.21947); idempotent.

    A tool is then spelled by one token per level, so the vocabulary grows by L×K rows however many
    tools there are. The new rows have no name to start from, so they are sampled around the mean
    of the existing rows with each coordinate's spread (the idea of Hugging Face's
    ``mean_resizing``, with a diagonal covariance): every code starts as an ordinary, equally likely
    token, and the stages tell them apart. Seed torch for reproducible rows.

    Returns:
        ``ids[level][code]``: the token id of each code.
    """
    tokens = [code_token(level, code) for level in range(levels) for code in range(size)]
    vocab = tokenizer.get_vocab()  # builds a dict: once, not once per token
    missing = [t for t in tokens if t not in vocab]
    if missing:
        # The rows of real tokens: a table can be padded past the tokenizer (Qwen2.5: 151,936 rows
        # for 151,665 tokens), and its unused padding rows say nothing about a token's spread.
        known = len(tokenizer)
        stats = [(t.detach()[:known].mean(0), t.detach()[:known].std(0)) for t in embedding_tables(model)]
        tokenizer.add_tokens(missing)
        new = tokenizer.convert_tokens_to_ids(missing)
        grow_tables(model, len(tokenizer))
        for table, (mean, std) in zip(embedding_tables(model), stats, strict=True):
            noise = torch.randn(len(new), table.shape[1], dtype=table.dtype, device=table.device)
            table[new] = mean + std * noise
    ids = tokenizer.convert_tokens_to_ids(tokens)
    return [ids[level * size : (level + 1) * size] for level in range(levels)]


@torch.no_grad()
def init_code_rows(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    ids: Sequence[Sequence[int]],
    codes: Mapping[str, Sequence[int]],
    names: Mapping[str, str],
) -> int:
    """Start every code token that spells a tool at the mean name row of the tools it spells.

    ToolGen (arXiv 2410.03439) starts a tool's token at the mean of its name's subword rows; a
    ToolWeaver code is shared, so its row starts at the mean of those means over the tools whose
    code has it at that level (about one tool at the last level, where codes are nearly unique).
    On a pretrained LM this puts a code near the words of its tools, where the sampled rows of
    :func:`add_code_tokens` start every code alike and leave LoRA's small updates far to travel.
    Codes no tool uses keep their sampled rows.

    Args:
        ids: ``ids[level][code]``, as :func:`add_code_tokens` returns.
        codes: Tool id -> its code (one code index per level).
        names: Tool id -> tool name.

    Returns:
        The number of code tokens whose rows were set.
    """
    tools = list(codes)
    members: dict[int, list[int]] = {}
    for row, tool in enumerate(tools):
        for level, code in enumerate(codes[tool]):
            members.setdefault(int(ids[level][int(code)]), []).append(row)
    spoken = [spoken_name(names[t]) for t in tools]
    for table in embedding_tables(model):
        name_rows = name_embedding_rows(table.detach(), tokenizer, spoken)
        for token_id, rows in members.items():
            table[token_id] = name_rows[rows].mean(0)
    return len(members)
