"""Rejection sampling by retrieval reward: which sampled rewrite of each query the generator learns.

arXiv 2412.03573 (Sec. 3.3) aligns the generator with the retriever by rewarding each generated
query with the retrieval quality it produces. Here a round samples several rewrites per training
query and keeps the best-rewarded one as a fine-tuning target when it beats nothing (reward 0) and
does at least as well as the user's own words; those pairs are the next Ray Train stage's data.
"""

from __future__ import annotations

from collections.abc import Mapping

from components.data.splits import same_request
from components.data.types import Qrels, Queries
from components.methods.base import Method
from components.methods.querygen.data import rewrite_reward
from components.metrics import relevant_tools


def choose_rewrites(
    queries: Queries,
    candidates: Mapping[str, list[str]],
    retriever: Method,
    qrels: Qrels,
    metric: str,
) -> tuple[list[tuple[str, str]], dict[str, float]]:
    """The (query text, best rewrite) pairs to fine-tune on, and the round's figures: mean reward of
    all samples, of the kept ones and of the original queries, and the share of queries kept.

    An empty candidate is a sample cut by the token cap (``generate_texts(finished_only=True)``):
    it earns no reward and is never kept. Searched as the user's own words instead, it tied with
    them and was kept as a "rewrite" that copies the query, teaching the generator to echo.
    """
    flat = {f"{q}\t{j}": c for q, cs in candidates.items() for j, c in enumerate(cs) if c}
    depth = int(metric.partition("@")[2])
    found = retriever.retrieve(flat, depth) if flat else {}
    own = retriever.retrieve(dict(queries), depth)
    pairs, sampled, kept, original = [], [], [], []
    for q, text in queries.items():
        relevant = relevant_tools(qrels[q])
        keys = [f"{q}\t{j}" for j in range(len(candidates[q]))]
        scored = [(rewrite_reward(relevant, found[key], metric), flat[key]) for key in keys if key in flat]
        sampled += [reward for reward, _ in scored] + [0.0] * (len(keys) - len(scored))
        original.append(rewrite_reward(relevant, own[q], metric))
        # A sample that asks in the query's own words ties with it and was kept: an echo, which
        # fine-tuning on teaches (the defect the empty-sample rule above was for).
        choices = [(reward, c) for reward, c in scored if same_request(c) != same_request(text)]
        if not choices:
            continue
        best_reward, best = max(choices, key=lambda x: x[0])  # the first of equals: sampling order
        if best_reward > 0 and best_reward >= original[-1]:
            pairs.append((text, best))
            kept.append(best_reward)
    stats = {
        "sampled_reward": sum(sampled) / max(len(sampled), 1),
        "best_reward": sum(kept) / max(len(kept), 1),
        "original_reward": sum(original) / max(len(original), 1),
        "kept": len(pairs) / max(len(queries), 1),
    }
    return pairs, stats
