"""Deterministic byte-pair-encoding vocabulary learning (Sennrich et al., 2016, arXiv 1508.07909).

Why not ``tokenizers``' own trainers: they keep symbol and pair counts in Rust hash maps seeded
per process, so merges with equal counts are taken in a different order on every run. Two runs
on the same corpus then give different vocabularies (a few tie tokens) and, worse, different
token ids, so a model built from a config with a fixed seed still starts from different weights
and ``toolscout run`` reports different figures each time. This learner is the same greedy
algorithm (most frequent adjacent pair first, stop at ``vocab_size`` or when the best pair occurs
fewer than ``min_frequency`` times) with ties broken by the ids of the pair's two symbols, as
``tokenizers`` does, but from ids that are themselves assigned in a fixed order; equal input
gives byte-identical output. The vocabularies it learns are loaded into ``tokenizers``' WordPiece and
BPE models, which do the (fast, deterministic) encoding.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

Pair = tuple[str, str]


@dataclass
class Learned:
    """A learned vocabulary: token -> id (specials first, then the alphabet, then merges in
    the order they were learned) and the merges as ``(left, right)`` pairs in that order."""

    vocab: dict[str, int]
    merges: list[Pair]


def split_word(word: str, prefix: str) -> list[str]:
    """A word's characters; every one after the first carries ``prefix`` (``##`` for WordPiece)."""
    return [word[0]] + [prefix + ch for ch in word[1:]]


def learn_bpe(
    words: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    specials: Iterable[str] = (),
    alphabet: Iterable[str] = (),
    prefix: str = "",
) -> Learned:
    """Learn BPE merges over pre-tokenized ``words`` (each occurrence once, repeats counted).

    Args:
        words: Pre-tokenized words, in any order (only their counts matter).
        vocab_size: Stop once the vocabulary has this many tokens.
        min_frequency: Stop when the most frequent pair occurs fewer times than this.
        specials: Tokens that get the first ids.
        alphabet: Extra initial symbols (e.g. all 256 byte-level characters), kept even if unseen.
        prefix: Marks a symbol that continues a word (``##`` for WordPiece, ``""`` for plain BPE).
    """
    counts = Counter(w for w in words if w)
    # Sorted once, so each word's index (and every later iteration) is the same on every run.
    entries = sorted(counts.items())
    symbols = [split_word(w, prefix) for w, _ in entries]
    freq = [c for _, c in entries]

    vocab: dict[str, int] = {}
    for token in [*specials, *alphabet]:
        vocab.setdefault(token, len(vocab))
    # Every character on its own (so a word starting with one only seen mid-word is not [UNK]),
    # then the continuing forms, each by code point: ids order ties.
    chars = {ch for word, _ in entries for ch in word}
    continuing = {s for syms in symbols for s in syms[1:]}
    for token in [*sorted(chars), *sorted(continuing - chars)]:
        vocab.setdefault(token, len(vocab))

    pair_count: Counter[Pair] = Counter()
    where: dict[Pair, set[int]] = {}
    for i, syms in enumerate(symbols):
        for pair in pairwise(syms):
            pair_count[pair] += freq[i]
            where.setdefault(pair, set()).add(i)
    # Max-heap by count, ties to the pair of smaller ids (as in tokenizers' BPE trainer, which
    # grows words from their first character); entries whose count changed are stale and skipped.
    heap = [(-c, vocab[pair[0]], vocab[pair[1]], pair) for pair, c in pair_count.items()]
    heapq.heapify(heap)

    merges: list[Pair] = []
    while len(vocab) < vocab_size and heap:
        neg, _, _, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg:  # stale: the count changed since this entry was pushed
            continue
        if -neg < min_frequency:
            break
        left, right = pair
        merged = left + right.removeprefix(prefix)
        merges.append(pair)
        vocab.setdefault(merged, len(vocab))
        changed: set[Pair] = set()
        for i in sorted(where.pop(pair, ())):
            syms, c = symbols[i], freq[i]
            for old in pairwise(syms):
                pair_count[old] -= c
                changed.add(old)
            symbols[i] = syms = merge_pair(syms, left, right, merged)
            for new in pairwise(syms):
                pair_count[new] += c
                where.setdefault(new, set()).add(i)
                changed.add(new)
        for p in changed:
            if pair_count[p] > 0:
                heapq.heappush(heap, (-pair_count[p], vocab[p[0]], vocab[p[1]], p))
            else:
                pair_count.pop(p, None)
                where.pop(p, None)
    return Learned(vocab=vocab, merges=merges)


def merge_pair(syms: list[str], left: str, right: str, merged: str) -> list[str]:
    """``syms`` with every non-overlapping ``left right`` (scanned left to right) replaced by ``merged``."""
    out: list[str] = []
    i = 0
    while i < len(syms):
        if i + 1 < len(syms) and syms[i] == left and syms[i + 1] == right:
            out.append(merged)
            i += 2
        else:
            out.append(syms[i])
            i += 1
    return out
