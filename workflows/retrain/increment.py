"""An increment of new data, validated on Ray Data and merged into the base dataset.

An increment is a directory (local or s3://) in the BEIR layout holding only what is new:

    corpus.jsonl                new tools, or new versions of existing ones (same ``_id``)
    queries.jsonl               new queries: logged requests
    qrels/<split>.tsv           the tools each new query used (``train``, or ``valid`` to grow the
                                holdout); ``test`` is fixed for final reports and not accepted
    tooldet/neg_queries.jsonl   new requests that needed no tool

Every file is optional, but an increment must bring something. Each file is parsed in parallel by
the same row rules as ``toolscout preprocess`` (:func:`workflows.ray_ingest.ingest`); rows that
break them, qrels naming a query or tool that neither the base nor the increment has, and queries
whose ids the base already uses (they would leak between splits) are rejected with file, line
and reason. The merged dataset is the base with the increment on top: new tools added, changed
tools replaced, new queries and judgements appended.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from components.data import io
from components.data.loader import NEG_QUERIES, SourceFile, list_splits, one_split_per_query
from components.data.rejects import DatasetError, RejectLog
from components.data.resolve import not_tool_queries, resolve_qrels, resolve_records, unique_texts
from components.data.splits import same_request, with_holdout
from components.data.types import Dataset, Qrels
from workflows.ray_ingest import ingest

ACCEPTED_SPLITS = ("train", "valid")


@dataclass
class Increment:
    """What an increment adds, after validation."""

    tools: dict[str, dict] = field(default_factory=dict)
    queries: dict[str, str] = field(default_factory=dict)
    qrels: dict[str, Qrels] = field(default_factory=dict)
    neg_queries: list[str] = field(default_factory=list)

    def counts(self, base: Dataset, merged: Dataset | None = None) -> dict[str, int]:
        """What the increment added. A tool sent again unchanged is not an update, and with
        ``merged`` each split counts the increment's queries where the merge put them (a training
        query repeating a holdout request joins the holdout)."""
        judged = {s: set(q) for s, q in self.qrels.items()}
        if merged is not None:
            ours = set().union(*judged.values()) if judged else set()
            # Every split holding one of ours, not only the increment's own: a train-only
            # increment's twin of a holdout request is in valid after the merge, and counted there.
            where = {s: ours & set(q) for s, q in merged.qrels.items()}
            judged = {s: found for s, found in where.items() if found or s in self.qrels}
        return {
            "new_tools": len(self.new_tools(base)),
            "updated_tools": sum(t in base.corpus and base.corpus[t] != r for t, r in self.tools.items()),
            "new_queries": len(self.queries),
            **{f"{s}_judged_queries": len(q) for s, q in judged.items()},
            "neg_queries": len(self.neg_queries),
        }

    def new_tools(self, base: Dataset) -> list[str]:
        return [t for t in self.tools if t not in base.corpus]


def sources(root: str, storage_options: dict[str, Any] | None = None) -> list[SourceFile]:
    """The increment's files.

    Raises:
        DatasetError: the directory holds none of the accepted files, or a qrels split other than
            ``train`` / ``valid``.
    """
    found = [
        SourceFile(rel, kind)
        for rel, kind in (("corpus.jsonl", "records"), ("queries.jsonl", "records"), (NEG_QUERIES, "neg"))
        if io.exists(io.join(root, rel), storage_options)
    ]
    splits = list_splits(root, storage_options)
    bad = [s for s in splits if s not in ACCEPTED_SPLITS]
    if bad:
        raise DatasetError(
            f"{io.join(root, 'qrels')}: increment split(s) {bad} not accepted; expected "
            f"{list(ACCEPTED_SPLITS)} (the test split is fixed for final reports)"
        )
    found += [SourceFile(f"qrels/{s}.tsv", "qrels") for s in splits]
    if not found:
        raise DatasetError(
            f"{root}: no increment files; expected some of corpus.jsonl, queries.jsonl, "
            f"qrels/<train|valid>.tsv, {NEG_QUERIES}"
        )
    return found


def read_increment(
    root: str,
    base: Dataset,
    log: RejectLog,
    storage_options: dict[str, Any] | None = None,
    parallelism: int = 4,
) -> Increment:
    """Parse and check the increment at ``root`` against ``base`` (as loaded, before splitting)."""
    files = sources(root, storage_options)
    rows, _ = ingest(root, files, log, storage_options, parallelism)
    tools = resolve_records("corpus.jsonl", rows.get("corpus.jsonl", []), log)
    records = resolve_records("queries.jsonl", rows.get("queries.jsonl", []), log)
    queries: dict[str, str] = {}
    line_of: dict[str, int] = {}
    for number, rec in sorted(rows.get("queries.jsonl", []), key=lambda r: r[0]):
        qid = rec["_id"]
        if qid in base.queries:
            log.add(
                "queries.jsonl",
                number,
                f"query id {qid!r} is already in the base data; new queries need new ids",
            )
        elif records.get(qid) is rec:
            queries[qid], line_of[qid] = rec["text"], number
    corpus = {**base.corpus, **tools}
    qrels: dict[str, Qrels] = {}
    for f in files:
        if f.kind == "qrels":
            # Judgements may name only the increment's own queries: a base query's are fixed.
            own = []
            for number, row in rows[f.rel]:
                if row[0] in base.queries:
                    log.add(
                        f.rel,
                        number,
                        f"query-id {row[0]!r} is a base query; an increment judges only its own new queries",
                        "\t".join(map(str, row)),
                    )
                else:
                    own.append((number, row))
            qrels[f.rel[len("qrels/") : -len(".tsv")]] = resolve_qrels(f.rel, own, queries, corpus, log)
    one_split_per_query(qrels, rows, log)  # a query judged in train and valid stays in valid
    judged = {q for split in qrels.values() for q in split}
    for qid in sorted(set(queries) - judged, key=line_of.get):
        log.add("queries.jsonl", line_of[qid], f"query {qid!r} has no judgement in the increment's qrels")
        del queries[qid]
    # A new tool query asking what a base no-tool query asks would label one request both ways;
    # the base keeps its label (the loader would reject the base's row next round instead).
    no_tool = {same_request(text) for text in base.neg_queries}
    for qid in sorted((q for q in queries if same_request(queries[q]) in no_tool), key=line_of.get):
        reason = f"query {qid!r} asks what a no-tool query of the base data asks (its judgements go with it)"
        log.add("queries.jsonl", line_of[qid], reason)
        del queries[qid]
        for split in qrels.values():
            split.pop(qid, None)
    neg = sorted(rows.get(NEG_QUERIES, []), key=lambda r: r[0])
    known_neg = set(base.neg_queries)
    # Each new no-tool text once, as the base loader keeps them (a repeat would weigh twice).
    # Nor one asking what a tool query of the base or the increment asks.
    neg = not_tool_queries(NEG_QUERIES, neg, {**base.queries, **queries}, log)
    new_neg = unique_texts(NEG_QUERIES, [(n, text) for n, text in neg if text not in known_neg], log)
    increment = Increment(tools, queries, qrels, new_neg)
    # Usable means new: a judgement of a new query, a new or changed tool, a new no-tool query. An
    # increment applied twice has none (its queries are in the base by then, its tools unchanged),
    # though its qrels files still name their splits.
    changed = [t for t, record in tools.items() if base.corpus.get(t) != record]
    if not (changed or any(qrels.values()) or increment.neg_queries):
        raise DatasetError(f"{root}: the increment adds nothing usable ({len(log)} row(s) rejected)")
    return increment


def merge(
    base: Dataset, increment: Increment, name: str | None = None, splits: dict | None = None
) -> Dataset:
    """``base`` with ``increment`` on top (a new :class:`Dataset`; ``base`` is unchanged).

    Where the increment brings valid judgements and the base has no valid split, the base's
    holdout is carved first with the run's ``splits`` settings, as it is for the base alone: a
    valid split present after the merge stops the carving, which would otherwise move the base's
    holdout queries into training (and a champion would be gated on queries it trained on). New
    training queries that repeat a holdout query's request join the holdout.
    """
    if "valid" in increment.qrels:
        base = with_holdout(base, splits)
    qrels = {split: dict(q) for split, q in base.qrels.items()}
    for split, new in increment.qrels.items():
        qrels.setdefault(split, {}).update(new)
    queries = {**base.queries, **increment.queries}
    # Logged requests repeat. A new training query asking what a holdout query asks (same text up
    # to case, punctuation and spacing) joins the holdout: trained on, it would let the challenger,
    # and not the champion, score a request it has seen, and the gate would favour it. Carving
    # groups such twins itself; this covers a holdout that exists before the merge.
    held = {same_request(queries[q]) for q in qrels.get("valid", {})}
    for qid in [q for q in increment.qrels.get("train", {}) if same_request(queries[q]) in held]:
        qrels["valid"][qid] = qrels["train"].pop(qid)
    return replace(
        base,
        name=name or base.name,
        corpus={**base.corpus, **increment.tools},
        queries=queries,
        qrels=qrels,
        neg_queries=list(base.neg_queries) + increment.neg_queries,
        neg_split={},
        graphs={},
    )
