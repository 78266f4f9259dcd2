"""Bi-encoder retrieval over a tool catalogue: the scoring part of the dense method, shared by
MassTool, whose semantic stage trains the same bi-encoder.

The text tower follows the dense baselines of the tool-retrieval papers (COLT, CIKM 2024;
MassTool, arXiv 2507.00487): queries and tool documents share an encoder, trained with the
multiple-negatives ranking loss (:mod:`components.encoders.contrastive`). The optional ID head
(one learned vector per training tool) adds a classifier-style score; ``mix`` weighs the two at
retrieval time and is selected on valid. Unseen tools (cold start) have no ID vector and are
scored by their text alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from components.data.tooltext import TOOL_FIELDS, tool_field_names, tool_texts
from components.data.types import Corpus, Dataset, Queries, Results
from components.encoders.bi_encoder import BiEncoder
from components.encoders.text_encoder import TextEncoder, spec_from
from components.encoders.vector_index import IndexSettings, VectorIndex, exact_top_k
from components.metrics import check_select_metric, evaluate_retrieval

# (queries, k) -> (scores, indices), as faiss's Index.search returns them.


@dataclass
class BiEncoderParams:
    """Hyper-parameters of a bi-encoder and its contrastive stage (dense's ``method.params``)."""

    encoder: dict[str, Any] | str = field(default_factory=dict)  # EncoderSpec fields, or a hub name/path
    id_head: bool = True
    mix: float = 0.5  # retrieval score = (1 - mix) * text + mix * id
    mix_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    temperature: float = 0.05
    id_loss_weight: float = 1.0
    epochs: int = 8
    batch_size: int = 64
    lr: float = 5e-4
    weight_decay: float = 0.01
    tool_fields: tuple[str, ...] = TOOL_FIELDS
    tool_max_length: int = 96
    select_metric: str = "ndcg@3"
    # The CPU profile of a pretrained backbone (components/encoders/layer_cache.py): the embeddings
    # and this many lowest layers stay frozen, their outputs computed once per training text.
    frozen_layers: int = 0
    # "batch": each batch encodes its positives' tool texts with gradients (in-batch negatives);
    # "epoch": every tool is encoded once per epoch by the current encoder, without gradients, and
    # each query is scored against all of them (cheaper: no tool text runs through backward).
    tool_vectors: str = "batch"
    # How tool vectors are searched (components/encoders/vector_index.py): "auto" = exact below
    # index_exact_below tools, HNSW above; or "exact" (torch matmul), "faiss" (FAISS flat), "hnsw".
    index_backend: str = "auto"
    index_exact_below: int = 50_000
    index_m: int = 32
    index_ef_construction: int = 80
    index_ef_search: int = 256
    progress: bool = False

    def __post_init__(self) -> None:
        check_select_metric("dense", self.select_metric)
        self.tool_fields = tool_field_names(self.tool_fields, "dense")
        if self.frozen_layers < 0 or self.tool_vectors not in ("batch", "epoch"):
            raise ValueError(
                f"frozen_layers must be >= 0 and tool_vectors 'batch' or 'epoch'; got "
                f"{self.frozen_layers} and {self.tool_vectors!r}"
            )
        self.index_settings()  # a bad index kind or size fails here, not at the first query
        if not self.temperature > 0:
            # The loss divides by it: 0 trains on NaN, a negative one ranks the positives last.
            raise ValueError(f"temperature must be > 0; got {self.temperature}")
        if self.epochs < 0 or (self.epochs == 0 and self.id_head):
            # epochs 0 is the zero-shot row: an untrained ID head would only add noise to it.
            raise ValueError(f"epochs must be >= 1, or 0 (zero-shot) with id_head: false; got {self.epochs}")
        if self.epochs == 0 and not spec_from(self.encoder).name_or_path:
            # ... and an encoder built here from a config, never trained, would score at random.
            raise ValueError("epochs 0 (zero-shot) needs a pretrained encoder (encoder.name_or_path)")

    def index_settings(self) -> IndexSettings:
        """The ``index_*`` params as :class:`IndexSettings`."""
        return IndexSettings(
            kind=self.index_backend,
            exact_below=self.index_exact_below,
            m=self.index_m,
            ef_construction=self.index_ef_construction,
            ef_search=self.index_ef_search,
        )


def combined_tools(tools: torch.Tensor, ids: torch.Tensor | None, mix: float) -> torch.Tensor:
    """Tool vectors whose inner product with a query is the mixed score.

    ``(1 - mix) * q·t + mix * q·e = q·((1 - mix) * t + mix * e)``, so one inner-product index serves
    every mix. Tools without an ID vector (added after training) use their text vector for ``e``.

    Args:
        tools: ``(T, d)`` normalised tool-text embeddings.
        ids: ``(T, d)`` normalised ID vectors aligned with ``tools`` (NaN rows for unseen tools).
    """
    if ids is None or mix == 0.0:
        return tools
    by_id = torch.where(torch.isnan(ids[:, :1]), tools, ids)
    return (1.0 - mix) * tools + mix * by_id


def score_matrix(
    query: torch.Tensor, tools: torch.Tensor, ids: torch.Tensor | None, mix: float
) -> torch.Tensor:
    """``(Q, T)`` mixed scores (see :func:`combined_tools`)."""
    return query @ combined_tools(tools, ids, mix).T


def top_k(scores: torch.Tensor, qids: list[str], tool_ids: list[str], k: int) -> Results:
    """Results dict from a score matrix; tools tied at the cut are kept in catalog order, so a
    request's top k is the first k of its top K (:func:`exact_top_k`)."""
    values, index = exact_top_k(scores, min(k, scores.shape[1]))
    return {
        q: {tool_ids[j]: float(v) for v, j in zip(values[i].tolist(), index[i].tolist(), strict=True)}
        for i, q in enumerate(qids)
    }


def initial_bi_encoder(params: BiEncoderParams, data: Dataset, path: str, seed: int) -> None:
    """:func:`build_bi_encoder`, saved to ``path`` for a training stage to start from."""
    build_bi_encoder(params, data, seed).save(path)


def build_bi_encoder(params: BiEncoderParams, data: Dataset, seed: int) -> BiEncoder:
    """Train the tokenizer on the tools known at training time + training queries (or load the
    pretrained one) and build the bi-encoder, with an ID row per training tool when
    ``params.id_head``. A zero-shot dataset (no train split, e.g. LiveMCPBench) has no training
    queries and no training tools. The cold-start split's held-out tools stand for tools added
    later, so their words are not in a scratch tokenizer's vocabulary. A tool judged 0 by every
    training query it appears with is no training tool: its ID row would never be a target."""
    train = data.qrels.get("train", {})
    texts = tool_texts(data.corpus, data.known_tools(), params.tool_fields)
    texts += [data.queries[q] for q in train]
    torch.manual_seed(seed)  # the ID head is initialised here, also on top of a hub backbone
    encoder = TextEncoder.from_spec(spec_from(params.encoder), texts, seed=seed)
    trained = data.trained_tools()
    train_tools = [t for t in data.corpus if t in trained]  # corpus order
    return BiEncoder(encoder, train_tools if params.id_head else None)


class BiEncoderRetriever:
    """A bi-encoder indexed over a catalogue: text tower, optional ID head, and their mix."""

    def __init__(self, params: BiEncoderParams, model: BiEncoder | None = None) -> None:
        self.params = params
        self.mix = params.mix if params.id_head else 0.0
        self.model = model
        self.tool_ids: list[str] = []
        self._tools: torch.Tensor | None = None
        self._search: VectorIndex | None = None  # built from _tools (and _ids at mix) on demand
        self._search_key: tuple[float, IndexSettings] | None = None
        self._ids: torch.Tensor | None = None

    def variants(self) -> dict[str, float]:
        """Scoring modes: text tower, ID head and their selected mix.

        Tools the ID head has no vector for (added after training, ``test_unseen``) are scored by
        their text in every mode, so ``id`` rows on unseen tools are text scores for those tools.
        """
        if self.model is None or self.model.id_embeddings is None:
            return {"text": 0.0}
        return {"text": 0.0, "id": 1.0, "mixed": self.mix}

    def select_mix(self, data: Dataset) -> None:
        """Pick the text/ID mixing weight on valid (never test)."""
        if self.model is None or self.model.id_embeddings is None:
            self.mix = 0.0
            return
        self.index(data.corpus)
        queries = data.split_queries("valid")
        best = (-1.0, self.mix)
        for mix in self.params.mix_grid:
            self.mix = mix
            value = evaluate_retrieval(data.qrels["valid"], self.retrieve(queries, 10))[
                self.params.select_metric
            ]
            best = max(best, (value, mix))
        self.mix = best[1]

    def index(self, corpus: Corpus) -> None:
        """Embed every tool's text; align the ID table (NaN rows for tools it has no vector for)."""
        if self.model is None:
            raise RuntimeError("dense: train (fit) or load a model before indexing")
        self.tool_ids = list(corpus)
        texts = tool_texts(corpus, self.tool_ids, self.params.tool_fields)
        self._tools = self.model.embed_texts(texts, self.params.tool_max_length)
        self.index_ids()

    def retrieve(self, queries: Queries, k: int) -> Results:
        if self.model is None or self._tools is None:
            raise RuntimeError("dense: call index() before retrieve()")
        qids = list(queries)
        search = self.searcher()
        out: Results = {}
        for i in range(0, len(qids), 1024):
            chunk = qids[i : i + 1024]
            q = self.model.embed_texts([queries[x] for x in chunk])
            values, index = search.search(q, k)
            out |= {
                qid: {
                    self.tool_ids[j]: float(v)
                    for v, j in zip(values[r].tolist(), index[r].tolist(), strict=True)
                    if j >= 0
                }
                for r, qid in enumerate(chunk)
            }
        return out

    def searcher(self) -> VectorIndex:
        """The index over the tool vectors at the current ``mix``, built once per (vectors, mix,
        index settings)."""
        assert self._tools is not None
        key = (self.mix, self.params.index_settings())
        if self._search is None or self._search_key != key:
            matrix = combined_tools(self._tools, self._ids, self.mix)
            self._search, self._search_key = VectorIndex(matrix, key[1]), key
        return self._search

    def index_ids(self) -> None:
        """Re-align the ID table to ``tool_ids`` (after load, without re-embedding tool texts)."""
        assert self.model is not None and self._tools is not None
        self._ids = None
        self._search = None  # new vectors: the search index is built again
        if self.model.id_embeddings is not None:
            # On the CPU, beside the tool vectors (in a GPU worker's validation the table is on the GPU).
            table = torch.nn.functional.normalize(self.model.id_embeddings.weight.detach(), dim=-1).cpu()
            row = {t: i for i, t in enumerate(self.model.id_tool_ids)}
            self._ids = torch.full_like(self._tools, float("nan"))
            known = [(j, row[t]) for j, t in enumerate(self.tool_ids) if t in row]
            if known:
                cols, rows = zip(*known, strict=True)
                self._ids[list(cols)] = table[list(rows)].to(self._ids.dtype)
        if self.params.index_settings().resolved(len(self.tool_ids)) != "exact":
            self.searcher()  # build a large index now (at index or load time), not on the first query
