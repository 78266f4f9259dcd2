"""In-memory shapes of the data contract (BEIR layout, as the public tool-retrieval datasets use)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# tool id -> {"_id", "title", "text", "metadata"}
Corpus = dict[str, dict]
# query id -> query text
Queries = dict[str, str]
# query id -> {tool id: relevance}
Qrels = dict[str, dict[str, int]]
# query id -> {tool id: score}, higher is better
Results = dict[str, dict[str, float]]


@dataclass
class Dataset:
    """A tool-retrieval dataset held in memory.

    Attributes:
        name: Short name used in reports (the directory's basename by default).
        corpus: Tools by id.
        queries: Every query text by id (all splits share one file, as in BEIR).
        qrels: Relevance judgements by split name (``train``, ``valid``, ``test``, ...).
        query_scene: Query id -> scene id, by split, when scene files exist.
        scene_tool: Scene id -> the tool ids that scene (one query's needs) groups.
        neg_queries: Queries that need no tool (for tool-usage detection).
        neg_split: The no-tool queries divided into train / valid / test (fixed by seed).
        graphs: The training-split graphs ``toolscout preprocess`` built with Ray Data (name ->
            :class:`components.data.graphs.SparseGraph`: ``cooccurrence``, ``query_tool``,
            ``scene_tool``, ``query_scene``); empty for a dataset loaded raw, whose graphs
            :func:`components.data.graphs.training_graphs` builds in-process.
    """

    name: str
    corpus: Corpus
    queries: Queries
    qrels: dict[str, Qrels]
    query_scene: dict[str, dict[str, str]] = field(default_factory=dict)
    scene_tool: dict[str, list[str]] = field(default_factory=dict)
    neg_queries: list[str] = field(default_factory=list)
    neg_split: dict[str, list[str]] = field(default_factory=dict)
    graphs: dict[str, Any] = field(default_factory=dict)

    def split_queries(self, split: str) -> Queries:
        """Texts of the queries judged in ``split``."""
        if split not in self.qrels:
            raise KeyError(f"dataset {self.name!r} has no split {split!r}; it has {sorted(self.qrels)}")
        return {qid: self.queries[qid] for qid in self.qrels[split]}

    def trained_tools(self) -> set[str]:
        """Tools some training query needs (a positive ``train`` judgement); in the cold-start split
        every other tool stands for one added after training. Empty without a train split."""
        return {t for rel in self.qrels.get("train", {}).values() for t, s in rel.items() if s > 0}

    def known_tools(self) -> list[str]:
        """Tools that exist at training time, in corpus order: all but those only a ``test_unseen``
        split mentions. In the cold-start split every query needing a held-out tool moved to
        ``test_unseen``: those tools stand for tools added after training, so nothing trained
        (a tokenizer's vocabulary, an LM's tool tokens, a code) may be built from them. A seen
        tool that only such queries use is left out with them: the judgements cannot tell it apart."""
        seen = {
            t
            for name, split in self.qrels.items()
            if name != "test_unseen"
            for rel in split.values()
            for t in rel
        }
        unseen = {t for rel in self.qrels.get("test_unseen", {}).values() for t in rel} - seen
        return [t for t in self.corpus if t not in unseen]

    def summary(self) -> dict[str, int]:
        """Row counts for manifests and logs."""
        out = {"tools": len(self.corpus), "queries": len(self.queries), "neg_queries": len(self.neg_queries)}
        for split, qrels in sorted(self.qrels.items()):
            out[f"{split}_queries"] = len(qrels)
            out[f"{split}_pairs"] = sum(len(v) for v in qrels.values())
        out["scenes"] = len(self.scene_tool)
        return out
