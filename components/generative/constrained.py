"""Trie-constrained beam search: the top-k distinct tools an LM generates, with their scores.

ToolGen (arXiv 2410.03439, Sec. 3.3) retrieves by generation: at a tool position only tokens that
spell a real tool may be generated, so every output is a real tool (no hallucinated names), and
beam search with ``num_beams >= k`` yields ``k`` distinct tools ranked by their beam log-probability.
The same search narrowed to a per-query candidate trie re-ranks a given set (the Serve selector).

Scores are the summed log-probabilities of the code's tokens under the LM's full softmax, i.e. the
beam scores of ``generate`` with a ``prefix_allowed_tokens_fn`` before length normalisation.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from components.generative.targeted import NextTokenScorer, TargetedLM, last_logprobs
from components.generative.trie import TokenTrie

Hits = list[tuple[str, float]]  # (trie value, e.g. a tool id; score), best first


def _per_prompt(tries: TokenTrie | Sequence[TokenTrie], n: int) -> list[TokenTrie]:
    if isinstance(tries, TokenTrie):
        return [tries] * n
    if len(tries) != n:
        raise ValueError(f"got {len(tries)} tries for {n} prompts")
    return list(tries)


def _chunks(items: list, size: int) -> Iterator[tuple[int, list]]:
    for start in range(0, len(items), size):
        yield start, items[start : start + size]


def wanted_after(trie: TokenTrie, prefix: tuple[int, ...], end_token: int | None) -> list[int]:
    """The tokens whose log-probabilities a beam step reads after ``prefix``: those the trie allows
    next, and the end token where ``prefix`` is a complete code that longer codes extend."""
    allowed = list(trie.allowed(prefix))
    if prefix and end_token is not None and trie.value(prefix) is not None and trie.has_children(prefix):
        allowed.append(end_token)
    return allowed


def single_step_top_k(
    model: TargetedLM | NextTokenScorer,
    prompts: Sequence[Sequence[int]],
    tries: TokenTrie | Sequence[TokenTrie],
    k: int,
    pad_id: int,
    batch_size: int = 64,
) -> list[Hits]:
    """Top-``k`` tools when every code is one token: one forward pass per prompt.

    With single-token codes every beam ends after one step, so beam search with ``num_beams >= k``
    keeps exactly the ``k`` most probable allowed tokens: this top-k *is* the beam search result
    (:func:`trie_beam_search` gives the same hits; the tests check it).
    """
    tries = _per_prompt(tries, len(prompts))
    if any(t.depth > 1 for t in tries):
        raise ValueError("single_step_top_k needs single-token codes; use trie_beam_search")
    out: list[Hits] = []
    for start, chunk in _chunks(list(prompts), batch_size):
        wanted = [tries[start + row].allowed(()) for row in range(len(chunk))]
        logp = last_logprobs(model, chunk, pad_id, batch_size, wanted)
        for row in range(len(chunk)):
            trie = tries[start + row]
            allowed = wanted[row]
            if not allowed:
                out.append([])
                continue
            scores = logp[row, allowed]
            # Every tool tied with the k-th, then ties by tool id as trie_beam_search breaks them:
            # topk's own order among equal scores gave other tools (cold-start tools of one name
            # get identical rows, so they tie exactly).
            kth = scores.topk(min(k, len(allowed))).values[-1]
            tied = (scores >= kth).nonzero().flatten().tolist()
            hits = [(trie.value((allowed[j],)), float(scores[j])) for j in tied]
            out.append(sorted(hits, key=lambda h: (-h[1], h[0]))[:k])
    return out


def trie_beam_search(
    model: TargetedLM | NextTokenScorer,
    prompts: Sequence[Sequence[int]],
    tries: TokenTrie | Sequence[TokenTrie],
    k: int,
    pad_id: int,
    num_beams: int | None = None,
    end_token: int | None = None,
    batch_size: int = 64,
) -> list[Hits]:
    """Beam search over codes of any length; returns up to ``k`` distinct values per prompt.

    Each step keeps the ``num_beams`` best unfinished prefixes of each prompt; a prefix that spells a
    complete code with nothing longer below it is finished. A complete code that longer codes extend
    finishes with the log-probability of ``end_token`` added (or as is, without an end token).

    The search stops early once ``k`` finished values all score at least the best live prefix: a
    longer prefix only adds log-probabilities (<= 0), so no live beam can overtake them.

    Every step re-encodes prompt + prefix without a KV cache; tool codes are a few tokens long, so
    this costs a few prompt passes and keeps the search independent of each model's cache classes.
    """
    num_beams = max(num_beams or k, k)
    tries = _per_prompt(tries, len(prompts))
    live: list[list[tuple[tuple[int, ...], float]]] = [[((), 0.0)] for _ in prompts]
    finished: list[dict[str, float]] = [{} for _ in prompts]

    def finish(i: int, value: str, score: float) -> None:
        finished[i][value] = max(score, finished[i].get(value, float("-inf")))

    for _ in range(max((t.depth for t in tries), default=0) + 1):
        pending = [(i, prefix, score) for i, beams in enumerate(live) for prefix, score in beams]
        if not pending:
            break
        grown: list[list[tuple[tuple[int, ...], float]]] = [[] for _ in prompts]
        for _, chunk in _chunks(pending, batch_size):
            wanted = [wanted_after(tries[i], p, end_token) for i, p, _ in chunk]
            seqs = [[*prompts[i], *p] for i, p, _ in chunk]
            logp = last_logprobs(model, seqs, pad_id, batch_size, wanted)
            for row, (i, prefix, score) in enumerate(chunk):
                trie = tries[i]
                value = trie.value(prefix) if prefix else None
                if value is not None:  # complete, and longer codes continue it (leaves finish below)
                    finish(i, value, score + (float(logp[row, end_token]) if end_token is not None else 0.0))
                allowed = trie.allowed(prefix)
                if not allowed:
                    continue
                # Only a beam's num_beams best children can survive the cut below.
                top = logp[row, allowed].topk(min(num_beams, len(allowed)))
                for v, j in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                    grown[i].append(((*prefix, allowed[j]), score + v))
        for i, candidates in enumerate(grown):
            trie, keep = tries[i], []
            for prefix, score in sorted(candidates, key=lambda c: -c[1]):
                value = trie.value(prefix)
                if value is not None and not trie.has_children(prefix):
                    finish(i, value, score)
                elif len(keep) < num_beams:
                    keep.append((prefix, score))
            done = sorted(finished[i].values(), reverse=True)
            if keep and len(done) >= k and done[k - 1] >= keep[0][1]:
                keep = []  # exact early stop (see docstring)
            live[i] = keep
    return [sorted(f.items(), key=lambda x: (-x[1], x[0]))[:k] for f in finished]


def constrained_top_k(
    model: TargetedLM | NextTokenScorer,
    prompts: Sequence[Sequence[int]],
    tries: TokenTrie | Sequence[TokenTrie],
    k: int,
    pad_id: int,
    num_beams: int | None = None,
    end_token: int | None = None,
    batch_size: int = 64,
) -> list[Hits]:
    """Top-``k`` distinct tools per prompt; the exact one-step shortcut when every code is one token.

    ``model`` is the PyTorch LM or another engine's scorer (llama.cpp's, vLLM's); the search is the
    same, and each step asks the engine only for the tokens the trie allows (:func:`wanted_after`).
    """
    if k < 1:  # (an IndexError from the top-k, for a caller that asked for nothing)
        return [[] for _ in prompts]
    if isinstance(model, torch.nn.Module):
        model.eval()
    per_prompt = _per_prompt(tries, len(prompts))
    with torch.no_grad():
        if all(t.depth <= 1 for t in per_prompt):
            return single_step_top_k(model, prompts, per_prompt, k, pad_id, batch_size)
        return trie_beam_search(model, prompts, per_prompt, k, pad_id, num_beams, end_token, batch_size)
