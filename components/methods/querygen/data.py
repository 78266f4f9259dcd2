"""What the rewriter learns from and is scored by: SFT targets, rewrite rewards, rank fusion.

arXiv 2412.03573 (Sec. 3) fine-tunes the generator on targets built from each training query's
relevant tools (their names and short descriptions), so it learns to write queries in the tools'
own words; alignment then rewards a sampled rewrite by how well the retriever ranks the query's
relevant tools for it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from components.data.tooltext import ToolRecord
from components.data.types import Dataset, Results
from components.generative.sequences import tool_records
from components.metrics import query_metrics, ranked, relevant_tools


@dataclass
class RewritePairs:
    """(query text, target rewrite) pairs a generator stage trains on and validates with."""

    train: list[tuple[str, str]] = field(default_factory=list)
    valid: list[tuple[str, str]] = field(default_factory=list)


def tool_phrase(record: ToolRecord, words: int) -> str:
    """``"<name>: <first words of the description>"``, the unit an SFT target is made of."""
    description = " ".join(record.description.split()[:words]).rstrip(".,;:")
    return f"{record.name}: {description}" if description else record.name


def sft_target(records: Mapping[str, ToolRecord], tools: Sequence[str], max_tools: int, words: int) -> str:
    """The target rewrite for a query needing ``tools``: their phrases, in id order, ``; ``-joined."""
    return "; ".join(tool_phrase(records[t], words) for t in sorted(tools)[:max_tools])


def sft_pairs(
    data: Dataset, split: str, max_tools: int, words: int, limit: int | None = None, seed: int = 0
) -> list[tuple[str, str]]:
    """One (query, target) pair per query of ``split`` with a relevant tool in the corpus; with
    ``limit``, a seeded random sample of that many (a prefix would cover only the first scenes)."""
    qrels = data.qrels.get(split) or {}
    needed = sorted({t for rel in qrels.values() for t in relevant_tools(rel) if t in data.corpus})
    records = tool_records(data.corpus, needed)
    pairs = []
    for qid, rel in qrels.items():
        tools = [t for t in relevant_tools(rel) if t in records]
        if tools:
            pairs.append((data.queries[qid], sft_target(records, tools, max_tools, words)))
    if limit is not None and limit < len(pairs):
        pairs = random.Random(seed).sample(pairs, limit)
    return pairs


def round_queries(data: Dataset, n: int, seed: int) -> list[str]:
    """``n`` training queries with a relevant tool, sampled with ``seed`` (one alignment round's)."""
    qids = sorted(q for q, rel in data.qrels["train"].items() if relevant_tools(rel))
    return random.Random(seed).sample(qids, min(n, len(qids)))


def rewrite_reward(relevant: set[str], scores: Mapping[str, float], metric: str) -> float:
    """``metric`` (e.g. ``ndcg@3``) of one ranking against the query's relevant tools."""
    k = int(metric.partition("@")[2])
    return query_metrics(relevant, ranked(dict(scores), k), k)[metric]


def choose_fusion(valid: Mapping[str, float], metric: str) -> str:
    """``rrf`` when fusing beat the rewrite alone on ``metric`` in a valid check
    (``{"<fusion>_<metric>": value}``), else ``generated``."""
    return "rrf" if valid.get(f"rrf_{metric}", 0.0) > valid.get(f"generated_{metric}", 0.0) else "generated"


def retrieval_score(valid: Mapping[str, float], metric: str) -> float:
    """A generator's score in a valid check (``{"<fusion>_<metric>": value}``): ``metric`` under
    the better fusion, as :func:`choose_fusion` would serve it."""
    return max(valid.get(f"{fusion}_{metric}", 0.0) for fusion in ("generated", "rrf"))


def reciprocal_rank_fusion(rankings: Sequence[Results], k: int = 60, depth: int = 50) -> Results:
    """Cormack et al. (2009): each tool scores sum(1 / (k + rank)) over the rankings it appears in
    (rank from 1, each ranking read to ``depth``)."""
    fused: Results = {}
    for results in rankings:
        for qid, scores in results.items():
            out = fused.setdefault(qid, {})
            for rank, tool in enumerate(ranked(scores, depth), start=1):
                out[tool] = out.get(tool, 0.0) + 1.0 / (k + rank)
    return fused
