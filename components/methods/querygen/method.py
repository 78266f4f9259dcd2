"""Query generation in front of any retriever (arXiv 2412.03573, "Efficient and Effective Tool
Retrieval via Query Generation").

An LM rewrites each request into a search query that names the capabilities it needs; any registered
retriever (BM25, dense, MassTool ...) searches with it, alone or fused with the original query's
ranking (reciprocal rank fusion). Three generators, as in the paper:

- **zero-shot**: the instruct LM prompted as is (``sft.epochs: 0``, ``align.rounds: 0``), in this
  process, under llama.cpp on a GGUF file (fast on CPU), or behind an OpenAI-compatible endpoint
  for larger models;
- **supervised** (``sft``): fine-tuned (LoRA) on targets made of each training query's relevant
  tools' names and short descriptions;
- **aligned** (``align``): rejection-sampling fine-tuning by retrieval reward, iterated: each round
  samples several rewrites per training query, scores each by the retriever's ``reward_metric`` for
  that query's relevant tools, and fine-tunes on the best one (the paper's reward-driven alignment;
  rejection sampling instead of DPO keeps one training task for every stage).

Each generator stage is one Ray Train run of :class:`components.methods.querygen.task.RewriteTask`.
The caller only ever gets the retriever's catalog ids back: generated text never names a tool.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import asdict, replace
from typing import Any, ClassVar

import ray

from components import methods
from components.data.types import Corpus, Dataset, Queries, Results
from components.encoders.text_encoder import TextEncoder
from components.methods.base import Method, read_config, write_config
from components.methods.querygen.align import choose_rewrites
from components.methods.querygen.data import (
    RewritePairs,
    choose_fusion,
    reciprocal_rank_fusion,
    retrieval_score,
    round_queries,
    sft_pairs,
)
from components.methods.querygen.generator import LocalGenerator, make_generator, scratch_generator
from components.methods.querygen.params import QueryGenParams
from components.methods.querygen.task import pairs_nll
from components.metrics import evaluate_retrieval, ranked
from components.training.inputs import share
from components.training.spec import RunSpec, StageConfig, StageInputs

TASK = "components.methods.querygen.task:RewriteTask"
# Rewrites kept by query text: a test split is read once per fusion, a serving replica forever.
REWRITE_CACHE, REWRITE_CHUNK = 50_000, 256  # the chunk: texts per generator call in rewrite()


class QueryGenMethod:
    """An LM query rewriter plus a retriever (see module docstring)."""

    name: ClassVar[str] = "querygen"
    stages: ClassVar[tuple[str, ...]] = ("retriever", "sft", "align")
    # Tools added after training are found as the wrapped retriever finds them: by their text.
    # text_encoders: the wrapped retriever's, when it has them (dense, MassTool). An instance keeps
    # only those its retriever has (see _adopt).
    capabilities: ClassVar[frozenset[str]] = frozenset({"train", "cold_start", "text_encoders"})

    def __init__(self, **params: Any) -> None:
        self.params = QueryGenParams(**params)
        self.fusion = None if self.params.fusion == "auto" else self.params.fusion
        self.retriever: Method | None = None
        self.gen = make_generator(self.params)
        self._generator_source = self.gen.path  # where workers read it (see inputs.share)
        self._cache: OrderedDict[str, str] = OrderedDict()  # text -> rewrite, least recent first
        self.report: dict[str, dict[str, float]] = {}
        self.tool_ids: list[str] = []

    def config(self) -> dict[str, Any]:
        """The params, with the fusion chosen on valid (``None`` until fit or load chose it)."""
        return {**asdict(self.params), "fusion": self.fusion}

    # -- training ---------------------------------------------------------------------------
    def text_encoders(self) -> list[TextEncoder]:
        """The wrapped retriever's text encoders (none for BM25); the generator LM is not one."""
        if self.retriever is None:
            raise RuntimeError("querygen: fit or load first")
        return self.retriever.text_encoders() if "text_encoders" in self.retriever.capabilities else []

    def fit(self, stage: str, data: Dataset, run: RunSpec) -> dict[str, float]:
        """Run one stage; returns its metrics (each stage ends with a retrieval check on valid)."""
        steps = {"retriever": self._fit_retriever, "sft": self._fit_sft, "align": self._fit_align}
        if stage not in steps:
            raise ValueError(f"querygen has stages {self.stages}, not {stage!r}")
        out = steps[stage](data, run)
        out |= self.valid_check(data, stage)
        if stage == self.stages[-1] and self.fusion is None:  # "auto": the better fusion on valid
            self.fusion = choose_fusion(out, self.params.select_metric)
        self.report[stage] = out
        return out

    def _adopt(self, retriever: Method) -> None:
        """Wrap ``retriever``: cold start and text encoders are this method's only through it (over
        ToolGen, whose tokens are trained tools, a new tool is not found by its text)."""
        self.retriever = retriever
        self.capabilities = type(self).capabilities & (retriever.capabilities | {"train"})

    def _fit_retriever(self, data: Dataset, run: RunSpec) -> dict[str, float]:
        spec = self.params.retriever
        out: dict[str, float] = {}
        if "path" in spec:
            self._adopt(methods.load(spec["path"]))
        else:
            self._adopt(methods.build(spec["method"], spec.get("params")))
            child = replace(run, name=f"{run.name}-retriever")
            for name in self.retriever.stages:
                metrics = self.retriever.fit(name, data, child)
                out |= {f"retriever_{name}_{k}": v for k, v in metrics.items() if isinstance(v, float)}
        self.retriever.index(data.corpus)
        self.tool_ids = list(self.retriever.tool_ids)
        if isinstance(self.gen, LocalGenerator):
            if self.gen.path is None:  # no pretrained LM named: a small one built here (offline, tests)
                path = os.path.join(os.path.abspath(run.local_dir), f"{run.name}-generator-init")
                pairs = sft_pairs(data, "train", self.params.target_tools, self.params.description_words)
                self.gen.path = scratch_generator(self.params, [t for p in pairs for t in p], path, run.seed)
            # A directory (that LM, or a pretrained one named by its path) where every worker reads it.
            self._generator_source = share(self.gen.path, run, f"{run.name}-generator-init")
        return out

    def _train(
        self, stage: str, pairs: RewritePairs, settings: dict[str, Any], run: RunSpec
    ) -> dict[str, float]:
        """One generator stage on Ray Train from the current generator; the best checkpoint becomes it."""
        from components.training.runner import run_stage

        config = StageConfig(
            task=TASK,
            stage=stage,
            params=self.params,
            inputs=StageInputs(dataset=ray.put(pairs), init_dir=self._generator_source),
            epochs=int(settings["epochs"]),
            lr=float(settings["lr"]),
            batch_size=int(settings["batch_size"]),  # a round smaller than a batch is one batch
            score="valid_score",
            progress=self.params.progress,
        )
        result = run_stage(config, run)
        self.gen.load(result.model_dir)
        self._cache.clear()
        self._generator_source = result.model_uri
        return {**result.metrics, "stage_seconds": result.seconds}

    def _fit_sft(self, data: Dataset, run: RunSpec) -> dict[str, float]:
        p, settings = self.params, self.params.sft
        if int(settings["epochs"]) <= 0:
            return {}
        pairs = RewritePairs(
            train=sft_pairs(
                data, "train", p.target_tools, p.description_words, settings["max_examples"], p.seed
            ),
            valid=sft_pairs(data, "valid", p.target_tools, p.description_words, p.valid_queries, p.seed),
        )
        return self._train("sft", pairs, settings, run)

    def _fit_align(self, data: Dataset, run: RunSpec) -> dict[str, float]:
        """Rejection-sampling rounds: sample, reward by retrieval, fine-tune on each query's best.

        A round's checkpoint is chosen on the SFT targets' NLL (what the Ray Train stage can score
        per epoch), which alignment moves away from by design; so each round is then kept only if
        the rewrites retrieve at least as well on valid (``select_metric``, the better fusion) as
        the generator before it, else the generator goes back to that one (``round<r>_accepted``).
        """
        p, settings = self.params, self.params.align
        out: dict[str, float] = {}
        valid = sft_pairs(data, "valid", p.target_tools, p.description_words, p.valid_queries, p.seed)
        best_score = retrieval_score(self.report.get("sft") or self.valid_check(data, "sft"), p.select_metric)
        kept = (self.gen.path, self._generator_source)
        for r in range(1, int(settings["rounds"]) + 1):
            seed = p.seed * 1000 + r
            qids = round_queries(data, int(settings["queries"]), seed)
            chosen, stats = self.best_rewrites(
                data,
                qids,
                int(settings["samples"]),
                float(settings["temperature"]),
                float(settings["top_p"]),
                seed,
            )
            out |= {f"round{r}_{k}": v for k, v in stats.items()}
            if not chosen:
                out[f"round{r}_skipped"] = 1.0  # no sample earned any reward: nothing to learn from
                continue
            # How much likelier the generator makes the chosen rewrites: the round's direct effect.
            out[f"round{r}_chosen_nll_before"] = pairs_nll(*self.gen.model(), p, chosen)
            trained = self._train(f"align{r}", RewritePairs(train=chosen, valid=valid), settings, run)
            out[f"round{r}_chosen_nll_after"] = pairs_nll(*self.gen.model(), p, chosen)
            out |= {f"round{r}_{k}": v for k, v in trained.items()}
            check = self.valid_check(data, f"align{r}")
            out |= {f"round{r}_{k}": v for k, v in check.items()}
            score = retrieval_score(check, p.select_metric)
            out[f"round{r}_accepted"] = float(score >= best_score)
            if score >= best_score:
                best_score, kept = score, (self.gen.path, self._generator_source)
            else:  # worse on valid: the next round (and the artifact) start from the kept generator
                self.gen.load(kept[0])
                self._generator_source = kept[1]
                self._cache.clear()
        return out

    def best_rewrites(
        self, data: Dataset, qids: list[str], samples: int, temperature: float, top_p: float, seed: int
    ) -> tuple[list[tuple[str, str]], dict[str, float]]:
        """``samples`` sampled rewrites of each query, the best kept where it earns a reward
        (:func:`components.methods.querygen.align.choose_rewrites`), and the round's reward figures."""
        texts = [data.queries[q] for q in qids]
        candidates = self.gen.sample(texts, samples, temperature, top_p, seed)
        assert self.retriever is not None
        return choose_rewrites(
            dict(zip(qids, texts, strict=True)),
            dict(zip(qids, candidates, strict=True)),
            self.retriever,
            data.qrels["train"],
            self.params.reward_metric,
        )

    def valid_check(self, data: Dataset, stage: str) -> dict[str, float]:
        """Retrieval on (a prefix of) valid with the current generator, for both fusions."""
        qrels = dict(list((data.qrels.get("valid") or {}).items())[: self.params.valid_queries])
        if not qrels or self.retriever is None:
            return {}
        queries = {q: data.queries[q] for q in qrels}
        out = {}
        for fusion in ("generated", "rrf"):
            metrics = evaluate_retrieval(qrels, self.retrieve(queries, 5, fusion))
            out |= {f"{fusion}_{k}": metrics[k] for k in ("recall@3", "ndcg@3", "recall@5")}
        return out

    # -- generation and retrieval -------------------------------------------------------------
    def rewrite(self, queries: Queries) -> Queries:
        """The greedy rewrite of each query (cached by text; an empty one falls back to the query).
        New texts go a chunk at a time, each cached as it comes: a failure part-way loses one chunk."""
        todo = sorted({t for t in queries.values() if t not in self._cache})
        for start in range(0, len(todo), REWRITE_CHUNK):
            chunk = todo[start : start + REWRITE_CHUNK]
            self._cache.update(zip(chunk, self.gen.rewrite(chunk), strict=True))
        out = {q: self._cache[t] for q, t in queries.items()}
        for text in dict.fromkeys(queries.values()):  # the most recently asked last
            self._cache.move_to_end(text)
        while len(self._cache) > REWRITE_CACHE:  # a serving replica sees texts without end
            self._cache.popitem(last=False)
        return out

    def index(self, corpus: Corpus) -> None:
        """Index the catalog in the retriever (tools added later are found by their text)."""
        if self.retriever is None:
            raise RuntimeError("querygen: no retriever yet (fit the retriever stage or load an artifact)")
        self.retriever.index(corpus)
        self.tool_ids = list(self.retriever.tool_ids)

    def retrieve(self, queries: Queries, k: int, fusion: str | None = None) -> Results:
        """Top-``k`` catalog tools for each query, searched with its rewrite (and, fused, itself)."""
        assert self.retriever is not None, "index() first"
        fusion = fusion or self.fusion or "generated"
        depth = max(k, self.params.fusion_depth)
        found = self.retriever.retrieve(self.rewrite(queries), depth)
        if fusion == "rrf":
            found = reciprocal_rank_fusion(
                [self.retriever.retrieve(queries, depth), found], self.params.rrf_k, depth
            )
        return {q: {t: found.get(q, {})[t] for t in ranked(found.get(q, {}), k)} for q in queries}

    # -- artifacts ------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """``config.json`` (params, chosen fusion), ``generator/`` (HF LM; none for an endpoint
        or a llama.cpp GGUF, which the params name) and ``retriever/``."""
        assert self.retriever is not None, "nothing to save before the retriever stage"
        if isinstance(self.gen, LocalGenerator):
            self.gen.save(os.path.join(path, "generator"))
        self.retriever.save(os.path.join(path, "retriever"))
        write_config(
            path,
            {
                "method": self.name,
                "params": asdict(self.params),
                "fusion": self.fusion,
                "report": self.report,
            },
        )

    @classmethod
    def load(cls, path: str) -> QueryGenMethod:
        config = read_config(path)
        params = {**config["params"], "retriever": {"path": os.path.join(path, "retriever")}}
        method = cls(**params)
        method.fusion = config.get("fusion") or "generated"
        method.report = config.get("report") or {}
        method._adopt(methods.load(os.path.join(path, "retriever")))
        method.tool_ids = list(method.retriever.tool_ids)
        if isinstance(method.gen, LocalGenerator):
            method.gen.load(os.path.join(path, "generator"))
        return method
