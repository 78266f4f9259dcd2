"""Deterministic splits: validation carved from train, a cold-start split, and no-tool query splits.

Model selection must never see the test split (ToolLens ships a "tune" split byte-identical to test),
so every method selects on ``valid``, carved here from ``train`` by query. Assignment hashes the seed
with the item's id (a query id, or a no-tool query's text), so it is stable across machines and
does not shift when items are added; items that ask the same request (text equal up to case,
punctuation and spacing) go together.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from typing import Any

from components.data.types import Dataset, Qrels

NEG_FRACTIONS = {"train": 0.8, "valid": 0.1, "test": 0.1}


def unit_hash(seed: int, key: str) -> float:
    """A uniform number in [0, 1) fixed by ``seed`` and ``key``."""
    digest = hashlib.sha1(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def carve_validation(
    train: Qrels, fraction: float, seed: int, texts: dict[str, str] | None = None
) -> tuple[Qrels, Qrels]:
    """Split train qrels by query into (train, valid), ``fraction`` of queries going to valid.

    Given the queries' ``texts``, queries asking the same request under other ids (same text up to
    case, punctuation and spacing: :func:`same_request`) go where the first of them goes, so model
    selection never scores a request the model trained on. A query with no such twin is hashed by
    its own id, as without ``texts``.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"valid fraction must be in (0, 1), got {fraction}")
    new_train: Qrels = {}
    valid: Qrels = {}
    first: dict[str, str] = {}
    for qid, rel in train.items():
        key = first.setdefault(same_request(texts[qid]), qid) if texts and qid in texts else qid
        (valid if unit_hash(seed, key) < fraction else new_train)[qid] = rel
    if train and not valid:
        # Every model selection reads valid: an empty one would fail later with a bare KeyError.
        raise ValueError(
            f"valid fraction {fraction} carved no query out of {len(train)} train queries; "
            "raise splits.valid_fraction"
        )
    return new_train, valid


def held_out_tools(tool_ids: list[str], fraction: float, seed: int) -> set[str]:
    """The seeded ~``fraction`` of tools that a cold-start split never shows in training."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"unseen-tool fraction must be in (0, 1), got {fraction}")
    return {t for t in tool_ids if unit_hash(seed + 7919, t) < fraction}


def cold_start(qrels: dict[str, Qrels], unseen: set[str]) -> dict[str, Qrels]:
    """Move every query that needs an unseen tool, from any split, into ``test_unseen``.

    The remaining splits keep only queries whose tools were all seen, so no training signal ever
    mentions an unseen tool (a zero-score judgment names the tool too, so it counts).

    Raises:
        ValueError: A query that needs an unseen tool is in two splits (its judgments would collide).
    """
    out: dict[str, Qrels] = {name: {} for name in qrels}
    out["test_unseen"] = {}
    came_from: dict[str, str] = {}
    for name, split in qrels.items():
        for qid, rel in split.items():
            if not unseen.intersection(t for t, s in rel.items() if s > 0):
                # It needs no unseen tool; a zero judgement of one goes (training never sees it).
                kept = {t: s for t, s in rel.items() if t not in unseen}
                if kept:
                    # Judged only by zeros on unseen tools, nothing is left of it: an empty entry
                    # a prepared dir cannot hold (its graphs kept the query, its qrels table had
                    # no row, and MassTool refused the preparation on every re-run).
                    out[name][qid] = kept
                continue
            if qid in came_from:
                raise ValueError(
                    f"cold start: query {qid!r} is in splits {came_from[qid]!r} and {name!r}; "
                    "a query id must belong to one split"
                )
            came_from[qid] = name
            out["test_unseen"][qid] = rel
    return out


def prepare_splits(
    dataset: Dataset,
    *,
    mode: str = "standard",
    valid_fraction: float = 0.1,
    unseen_fraction: float = 0.1,
    neg_fractions: dict[str, float] | None = None,
    seed: int = 0,
) -> Dataset:
    """Return a copy of ``dataset`` with ``valid`` (and, in ``cold_start`` mode, ``test_unseen``).

    Args:
        mode: ``standard`` or ``cold_start``.
        valid_fraction: Share of train queries carved into ``valid`` when the data has no valid split.
        unseen_fraction: Share of tools held out in ``cold_start`` mode.
        neg_fractions: Shares of no-tool queries for train / valid / test (80/10/10 by default).
        seed: Seed of every assignment.
    """
    if mode not in ("standard", "cold_start"):
        raise ValueError(f"split mode must be 'standard' or 'cold_start', got {mode!r}")
    if "train" not in dataset.qrels:
        raise ValueError(f"dataset {dataset.name!r} has no train split; it has {sorted(dataset.qrels)}")
    qrels = dict(dataset.qrels)
    if mode == "cold_start":
        unseen = held_out_tools(sorted(dataset.corpus), unseen_fraction, seed)
        qrels = cold_start(qrels, unseen)
        # A training scene can list a held-out tool (one its queries judge 0, or a sibling scene's):
        # the scene-tool graph would give that tool an embedding before it was ever seen.
        # A scene of held-out tools only is left out, as a prepared directory (rows per tool) has it.
        kept = {s: [t for t in ts if t not in unseen] for s, ts in dataset.scene_tool.items()}
        scene_tool = {s: ts for s, ts in kept.items() if ts}
        dataset = replace(dataset, scene_tool=scene_tool)
    if "valid" not in qrels:
        train, queries = qrels["train"], dataset.queries
        qrels["train"], qrels["valid"] = carve_validation(train, valid_fraction, seed, queries)
    # Training and selection need queries with an answer: a shipped valid the loader emptied (every
    # row rejected, or every query also in test) scored as no metric at all, and selection ran on it.
    needed = ("train", "valid", "test_unseen") if mode == "cold_start" else ("train", "valid")
    for name in needed:
        if not any(s > 0 for rel in qrels[name].values() for s in rel.values()):
            hint = "raise splits.unseen_fraction" if name == "test_unseen" else f"check qrels/{name}.tsv"
            raise ValueError(
                f"dataset {dataset.name!r}: split {name!r} has no query with a relevant tool "
                f"({len(qrels[name])} queries); {hint}"
            )
    neg_split = split_items(dataset.neg_queries, neg_fractions or NEG_FRACTIONS, seed)
    return replace(dataset, qrels=qrels, query_scene=regroup(dataset.query_scene, qrels), neg_split=neg_split)


def regroup(query_scene: dict[str, dict[str, str]], qrels: dict[str, Qrels]) -> dict[str, dict[str, str]]:
    """Re-file each query's scene under the split its query now belongs to."""
    scene_of = {q: s for split in query_scene.values() for q, s in split.items()}
    out = {name: {q: scene_of[q] for q in split if q in scene_of} for name, split in qrels.items()}
    return {name: m for name, m in out.items() if m}


SPLIT_KEYS = ("mode", "valid_fraction", "unseen_fraction", "neg_fractions", "seed")


def split_settings(cfg: dict | None) -> dict[str, Any]:
    """The ``splits`` config section with every default filled in (two sections that split data
    the same way compare equal).

    Raises:
        ValueError: a key :func:`prepare_splits` does not take.
    """
    s = cfg or {}
    unknown = sorted(set(s) - set(SPLIT_KEYS))
    if unknown:
        raise ValueError(f"splits: unknown keys {unknown}; expected some of {list(SPLIT_KEYS)}")
    neg = s.get("neg_fractions")
    return {
        "mode": s.get("mode", "standard"),
        "valid_fraction": float(s.get("valid_fraction", 0.1)),
        "unseen_fraction": float(s.get("unseen_fraction", 0.1)),
        "neg_fractions": {k: float(v) for k, v in neg.items()} if neg else dict(NEG_FRACTIONS),
        "seed": int(s.get("seed", 0)),
    }


def splits_from_config(dataset: Dataset, cfg: dict | None) -> Dataset:
    """:func:`prepare_splits` with the ``splits`` config section (mode, fractions, seed)."""
    return prepare_splits(dataset, **split_settings(cfg))


def with_holdout(dataset: Dataset, cfg: dict | None) -> Dataset:
    """``dataset`` with the ``valid`` split :func:`splits_from_config` would carve from train, if it
    has none, and nothing else changed (data that grows, as in a retrain, keeps its holdout)."""
    if "valid" in dataset.qrels or "train" not in dataset.qrels:
        return dataset
    settings = split_settings(cfg)
    qrels = dict(dataset.qrels)
    train = qrels["train"]
    pool = train
    if settings["mode"] == "cold_start":
        # Carved from what prepare_splits carves from: train after cold start takes out the queries
        # that need a held-out tool. Carved from all of train, a twin group's first query could be
        # one of those, the group fell elsewhere, and the champion was gated on a query it trained on.
        unseen = held_out_tools(sorted(dataset.corpus), settings["unseen_fraction"], settings["seed"])
        pool = cold_start({"train": train}, unseen)["train"]
    _, valid = carve_validation(pool, settings["valid_fraction"], settings["seed"], dataset.queries)
    qrels["valid"] = {q: train[q] for q in valid}  # as judged (prepare_splits applies cold start)
    qrels["train"] = {q: rel for q, rel in train.items() if q not in valid}
    return replace(dataset, qrels=qrels, query_scene=regroup(dataset.query_scene, qrels))


def same_request(text: str) -> str:
    """``text`` without case, punctuation or extra spacing: what two near-identical queries share."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def split_items(items: list[str], fractions: dict[str, float], seed: int) -> dict[str, list[str]]:
    """Assign items (e.g. no-tool query texts) to named parts by their hashed value, order kept.

    Hashing the item itself, not its position, keeps repeated texts in one part (no train/test
    leak) and leaves every other item where it was when one is inserted. Texts that differ only in
    case, punctuation or spacing ("Hi, how are you?" / "hi how are you") go where the first of them
    goes: ToolLens's no-tool queries hold 9 such groups, split across train and test by their own
    hashes before. A text with no such twin is hashed as itself, as before.

    Args:
        fractions: Part name -> share; shares must sum to 1.
    """
    if any(v < 0 for v in fractions.values()) or abs(sum(fractions.values()) - 1.0) > 1e-9:
        raise ValueError(f"split fractions must be >= 0 and sum to 1, got {fractions}")
    bounds = []
    acc = 0.0
    # The parts take hash ranges in one fixed order, not the mapping's: two configs listing the same
    # shares in another order compare equal (a prepared directory is reused on that), so they must
    # split alike.
    order = [p for p in ("train", "valid", "test") if p in fractions] + sorted(
        p for p in fractions if p not in ("train", "valid", "test")
    )
    for name in order:
        acc += fractions[name]
        bounds.append((acc, name))
    out: dict[str, list[str]] = {name: [] for name in fractions}
    first: dict[str, str] = {}
    for item in items:
        u = unit_hash(seed, first.setdefault(same_request(item), item))
        out[next(name for bound, name in bounds if u < bound or bound == bounds[-1][0])].append(item)
    return out
