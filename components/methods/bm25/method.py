"""BM25 baseline on bm25s (Lù, 2024), with analyzer profiles (see :mod:`.analyzers`).

The ``colt`` profile reproduces the BM25 row that COLT (CIKM 2024) and MassTool (arXiv 2507.00487)
publish for ToolLens; ``default`` is the one to use, with k1 and b selected on valid.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any, ClassVar

import bm25s
import numpy as np

from components.data.tooltext import tool_document
from components.data.types import Corpus, Dataset, Queries, Results
from components.encoders.ranking import exact_top_k_np
from components.methods.base import read_config, write_config
from components.methods.bm25.analyzers import PROFILES, Analyzer
from components.training.spec import RunSpec

# bm25s's scoring variants (Kamphuis et al., "Which BM25 Do You Mean?", ECIR 2020).
VARIANTS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


class BM25Method:
    """Lexical retrieval with Okapi BM25 (Robertson & Zaragoza, 2009).

    Args:
        profile: ``default``, ``lucene`` or ``colt`` (see :mod:`.analyzers`): presets the
            analyzer, k1, b and the indexed fields; each argument below overrides its preset.
        k1: Term-frequency saturation.
        b: Length normalisation.
        fields: ``"raw"`` to index the whole tool document, or a list of parsed tool fields
            (default: the profile's).
        variant: The bm25s scoring variant (``lucene``, ``robertson``, ``atire``, ``bm25l``,
            ``bm25+``; Kamphuis et al., ECIR 2020, compare them).
        analyzer: ``{tokenizer, stopwords, stemmer}`` to replace the profile's analyzer.
    """

    name: ClassVar[str] = "bm25"
    stages: ClassVar[tuple[str, ...]] = ()
    # cold_start: any tool with a text is indexed, whether or not training queries name it.
    capabilities: ClassVar[frozenset[str]] = frozenset({"cold_start", "exact_scores"})

    def __init__(
        self,
        profile: str = "default",
        k1: float | None = None,
        b: float | None = None,
        fields: str | list[str] | None = None,
        variant: str = "lucene",
        analyzer: dict[str, str] | None = None,
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"unknown BM25 profile {profile!r}; choose one of {sorted(PROFILES)}")
        if variant not in VARIANTS:
            raise ValueError(f"unknown BM25 variant {variant!r}; choose one of {list(VARIANTS)}")
        preset = PROFILES[profile]
        self.profile = profile
        self.variant = variant
        self.analyzer: Analyzer = Analyzer(**analyzer) if analyzer else preset["analyzer"]
        self.k1 = float(preset["k1"] if k1 is None else k1)
        self.b = float(preset["b"] if b is None else b)
        fields = preset["fields"] if fields is None else fields
        # One field may come as a string (fields=description); list() would spell it out.
        self.fields = fields if fields == "raw" else [fields] if isinstance(fields, str) else list(fields)
        self.tool_ids: list[str] = []
        self._bm25: bm25s.BM25 | None = None

    def config(self) -> dict[str, Any]:
        """Constructor arguments, as saved in ``config.json``."""
        return {
            "profile": self.profile,
            "k1": self.k1,
            "b": self.b,
            "fields": self.fields,
            "variant": self.variant,
            "analyzer": asdict(self.analyzer),
        }

    def fit(self, stage: str, data: Dataset, run: RunSpec) -> dict[str, float]:
        """BM25 has no training stage."""
        raise ValueError(f"bm25 has no training stages (asked for {stage!r})")

    def index(self, corpus: Corpus) -> None:
        """Tokenize and index every tool document."""
        tool_ids = list(corpus)
        tokens = self.analyzer([tool_document(corpus[t], self.fields) for t in tool_ids])
        if not any(tokens):
            # bm25s failed on it with "max() arg is an empty sequence".
            what = (
                "the catalog is empty" if not tool_ids else f"no word of its {len(tool_ids)} tools is indexed"
            )
            raise ValueError(
                f"bm25: nothing to index: {what} (analyzer {self.analyzer}, fields {self.fields})"
            )
        self.tool_ids = tool_ids
        self._bm25 = bm25s.BM25(k1=self.k1, b=self.b, method=self.variant)
        self._bm25.index(tokens, show_progress=False)

    def score_matrix(self, texts: list[str]) -> np.ndarray:
        """BM25 scores of every tool for each text, shape ``(len(texts), n_tools)``."""
        if self._bm25 is None:
            raise RuntimeError("call index() or load() before retrieving")
        vocab = self._bm25.vocab_dict
        out = np.zeros((len(texts), len(self.tool_ids)), dtype=np.float32)
        for i, tokens in enumerate(self.analyzer(texts)):
            ids = [vocab[t] for t in tokens if t in vocab]
            if ids:
                out[i] = self._bm25.get_scores(ids)
        return out

    def retrieve(self, queries: Queries, k: int) -> Results:
        """Top-``k`` tools per query; queries with no known term get an empty ranking."""
        qids = list(queries)
        k = min(k, len(self.tool_ids))
        results: Results = {}
        for start in range(0, len(qids), 1024):
            chunk = qids[start : start + 1024]
            scores = self.score_matrix([queries[q] for q in chunk])
            # Tools tied at the cut in catalog order: a request's top k is the first k of its top K
            # (argpartition kept an arbitrary one of the tied tools, so the answer moved with k).
            top = exact_top_k_np(scores, k)
            for row, qid in enumerate(chunk):
                results[qid] = {
                    self.tool_ids[j]: float(scores[row, j]) for j in top[row] if scores[row, j] > 0
                }
        return results

    def save(self, path: str) -> None:
        """``config.json`` + the bm25s index (numpy arrays and a JSON vocabulary)."""
        if self._bm25 is None:
            raise RuntimeError("nothing to save: call index() first")
        write_config(path, {"method": self.name, **self.config(), "tool_ids": self.tool_ids})
        self._bm25.save(os.path.join(path, "bm25s"))

    @classmethod
    def load(cls, path: str) -> BM25Method:
        """Load an index written by :meth:`save`."""
        config = read_config(path)
        # The analyzer the index was built with, even if the profile's preset changed since;
        # artifacts written before ``variant`` existed were all scored the Lucene way.
        method = cls(
            config["profile"],
            config["k1"],
            config["b"],
            config["fields"],
            config.get("variant", "lucene"),
            config.get("analyzer"),
        )
        method.tool_ids = list(config["tool_ids"])
        method._bm25 = bm25s.BM25.load(os.path.join(path, "bm25s"))
        return method
