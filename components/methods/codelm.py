"""The driver side of methods that retrieve tools by generating their codes with a causal LM.

ToolGen (arXiv 2410.03439) gives each tool one new vocabulary token; ToolWeaver (arXiv 2601.21947)
gives it a short sequence of shared code tokens. Everything else is common and lives here: the LM
is fine-tuned in stages (a plain-text warm-up for a scratch LM, then memorization: document -> code,
retrieval: query -> code, agent tuning: ReAct trajectories whose actions are codes), each one Ray
Train run starting from the previous stage's checkpoint; retrieval generates codes under a trie
constraint, so the top-k beams are k distinct real tools scored by their log-probability.

A subclass names its params class and LM-stage task and says how tools get codes
(:meth:`CodeLMMethod.add_codes`). This module is shared by method packages, not one itself.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any, ClassVar

import ray

from components.data.types import Corpus, Dataset, Queries, Results
from components.generative import sequences as td
from components.generative.bundle import load_bundle, save_bundle
from components.generative.constrained import Hits, constrained_top_k
from components.generative.hallucination import (
    Output,
    OutputParser,
    generate_outputs,
    hits_to_outputs,
    outputs_to_results,
)
from components.generative.lm import build_causal_lm, lm_spec_from, save_causal_lm, to_inference_device
from components.generative.params import LM_STAGES, CodeLMParams
from components.generative.perplexity import perplexity
from components.generative.targeted import TargetedLM
from components.generative.tool_tokens import ToolCodebook
from components.generative.trie import TokenTrie
from components.methods.base import read_config, write_config
from components.training.inputs import share
from components.training.spec import RunSpec, StageConfig, StageInputs


class CodeLMMethod:
    """Generative tool retrieval over an LM whose outputs are tool codes (see module docstring)."""

    name: ClassVar[str]
    stages: ClassVar[tuple[str, ...]] = LM_STAGES
    capabilities: ClassVar[frozenset[str]] = frozenset({"train", "generate", "candidates"})
    params_class: ClassVar[type[CodeLMParams]] = CodeLMParams
    task: ClassVar[str]  # import string of the LM stages' task

    def __init__(self, **params: Any) -> None:
        self.params = self.params_class(**params)
        self.stage_dirs: dict[str, str] = {}  # each stage's model on this machine
        self._stage_sources: dict[str, str] = {}  # the same, where workers read it (see inputs.share)
        self.report: dict[str, Any] = {}
        self.tool_ids: list[str] = []
        self.added_after_training: list[str] = []
        self._lm = self._tokenizer = None
        self._model: TargetedLM | None = None
        self.codebook = ToolCodebook()
        self._trie: TokenTrie | None = None
        self._names: dict[str, str] = {}

    @classmethod
    def from_dir(cls, model_dir: str, params: dict[str, Any] | None = None) -> CodeLMMethod:
        """A method around any LM stage's output directory (e.g. the retrieval stage alone)."""
        method = cls(**(params or {}))
        method.use_model(model_dir)
        return method

    def config(self) -> dict[str, Any]:
        return asdict(self.params)

    # --- what a subclass decides ----------------------------------------------------------

    def add_codes(self, corpus: Corpus, tools: list[str]) -> list[str]:
        """Give each of ``tools`` that has no code one, in the loaded LM; returns those coded now."""
        raise NotImplementedError

    def added_tokens(self) -> int:
        """How many tokens the method added to the LM's vocabulary."""
        raise NotImplementedError

    def untrained_dir(self) -> str:
        """The LM before any tool stage (after the warm-up), for an untrained baseline."""
        return self.stage_dirs["warmup"]

    def share_codes(self, trained: CodeLMMethod) -> None:
        """Take what ``trained`` (the same method after its stages) uses to code new tools, so that
        a model from one of its stage directories can index tools added later; a no-op here."""

    def save_extra(self, path: str) -> dict[str, Any]:
        """Write what the method keeps besides the LM bundle; returns extra ``config.json`` keys."""
        return {}

    def load_extra(self, path: str, config: dict[str, Any]) -> None:
        """The inverse of :meth:`save_extra`."""

    def before_stage(
        self, stage: str, init: str, source: str, data: Dataset, run: RunSpec
    ) -> tuple[str, str]:
        """The ``(local dir, worker-readable source)`` an LM stage starts from; by default the
        previous stage's output unchanged."""
        return init, source

    # --- training -------------------------------------------------------------------------

    def initial_model(self, data: Dataset, run: RunSpec) -> str:
        """Where the warm-up starts: a hub name/path as is, or a small Llama built and saved here.

        The scratch tokenizer is trained on the known tools' documents and the training queries
        (tools unseen in a cold-start split are left out, as tools that do not exist yet).
        """
        spec = lm_spec_from(self.params.lm)
        if spec.name_or_path:
            return spec.name_or_path
        path = os.path.join(os.path.abspath(run.local_dir), f"{run.name}-init")
        texts = td.warmup_texts(data, td.known_tools(data), self.params.tool_fields, None, run.seed)
        lm, tokenizer = build_causal_lm(spec, texts, seed=run.seed)
        save_causal_lm(lm, tokenizer, path)
        return path

    def stage_config(self, stage: str, init_dir: str, dataset: Dataset | ray.ObjectRef) -> StageConfig:
        """One LM stage for the runner: its own epochs, lr and batch size (``params.stages[stage]``),
        checkpoints ranked by the task's ``score`` (the stage's own validation measure)."""
        settings = self.params.stages[stage]
        return StageConfig(
            task=self.task,
            stage=stage,
            params=self.params,
            inputs=StageInputs(dataset=dataset, init_dir=init_dir),
            epochs=int(settings["epochs"]),
            lr=float(settings["lr"]),
            batch_size=int(settings["batch_size"]),
            weight_decay=float(settings.get("weight_decay", 0.0)),
            score="valid_score",
            progress=self.params.progress,
        )

    def fit(self, stage: str, data: Dataset, run: RunSpec) -> dict[str, float]:
        """Run one LM stage on Ray Train from the previous stage's best checkpoint (``epochs: 0`` skips)."""
        from components.training.runner import run_stage

        if stage not in LM_STAGES:
            raise ValueError(f"{self.name} has stages {self.stages}, not {stage!r}")
        index = LM_STAGES.index(stage)
        if index == 0:
            init = self.initial_model(data, run)
            source = share(init, run, f"{run.name}-init")
        else:
            init = self.stage_dirs[LM_STAGES[index - 1]]
            source = self._stage_sources[LM_STAGES[index - 1]]
        init, source = self.before_stage(stage, init, source, data, run)
        out: dict[str, float] = {"stage_seconds": 0.0}
        epochs = int(self.params.stages[stage]["epochs"])
        if stage == "warmup" and lm_spec_from(self.params.lm).name_or_path:
            epochs = 0  # a pretrained LM already knows the language; the warm-up is for scratch LMs
        if epochs > 0:
            result = run_stage(self.stage_config(stage, source, ray.put(data)), run)
            self.stage_dirs[stage] = result.model_dir
            self._stage_sources[stage] = result.model_uri
            out = {**result.metrics, "stage_seconds": result.seconds}
        else:
            self.stage_dirs[stage], self._stage_sources[stage] = init, source
        started = time.perf_counter()
        if stage == "warmup":
            # ToolGen's question: do tool tokens cost the LM its language? Measured before ...
            out |= self._perplexity_report(data, "before")
        if stage == LM_STAGES[-1]:
            self.use_model(self.stage_dirs[stage], data)
            out |= self._perplexity_report(data, "after")  # ... and after all stages.
            out["vocab_added"] = float(self.added_tokens())
            out["vocab_size"] = float(len(self._tokenizer))
        out["driver_seconds"] = time.perf_counter() - started
        self.report[stage] = out
        return out

    def _perplexity_report(self, data: Dataset, when: str) -> dict[str, float]:
        n = self.params.perplexity_texts
        if not n or not data.qrels.get("valid"):
            return {}
        if when == "before":
            lm, tokenizer, _ = load_bundle(self.stage_dirs["warmup"], lm_spec_from(self.params.lm).dtype)
            lm = to_inference_device(lm)
        else:
            lm, tokenizer = self._lm, self._tokenizer
        texts = [data.queries[q] for q in list(data.qrels["valid"])[:n]]
        return {
            f"perplexity_{when}": perplexity(lm, tokenizer, texts, self.params.query_max_length),
            f"vocab_{when}": float(len(tokenizer)),
        }

    def use_model(self, model_dir: str, data: Dataset | None = None) -> None:
        """Load an LM stage output; with ``data``, make sure every known tool has its code."""
        self._lm, self._tokenizer, self.codebook = load_bundle(model_dir, lm_spec_from(self.params.lm).dtype)
        if data is not None:
            self.add_codes(data.corpus, td.known_tools(data))
        # Retrieval and generation run where the process has an accelerator (a GPU replica, a GPU bench).
        self._lm = to_inference_device(self._lm).eval()
        self._model = TargetedLM(self._lm)
        self._prompter = td.Prompter(self._tokenizer)

    # --- retrieval ------------------------------------------------------------------------

    def index(self, corpus: Corpus) -> None:
        """Constrain decoding to ``corpus``; tools without a code get one now (see :meth:`add_codes`)."""
        if self._lm is None:
            raise RuntimeError(f"{self.name}: train (fit) or load a model before indexing")
        self.tool_ids = list(corpus)
        self._names = td.tool_names(corpus, self.tool_ids)
        self.added_after_training += self.add_codes(corpus, self.tool_ids)  # codes stay once given
        self._trie = self.codebook.trie(self.tool_ids)

    def _prompts(self, queries: Queries) -> list[list[int]]:
        return [self._prompter.retrieval(queries[q], self.params.query_max_length) for q in queries]

    def retrieve(self, queries: Queries, k: int, candidates: dict[str, list[str]] | None = None) -> Results:
        """Top-``k`` tools per query; ``candidates`` narrows each query's constraint to given tools."""
        if self._trie is None:
            raise RuntimeError(f"{self.name}: call index() before retrieve()")
        qids = list(queries)
        if self.params.decoding == "unconstrained" and candidates is None:
            return outputs_to_results(qids, self.generate(queries, k, constrained=False))
        tries = (
            self._trie if candidates is None else [self.codebook.trie(candidates.get(q, [])) for q in qids]
        )
        hits = self._constrained(queries, tries, k)
        return {q: dict(h) for q, h in zip(qids, hits, strict=True)}

    def _constrained(self, queries: Queries, tries: TokenTrie | list[TokenTrie], k: int) -> list[Hits]:
        """The one constrained decoder over ``tries`` (beams that can only spell a catalog code)."""
        return constrained_top_k(
            self._model,
            self._prompts(queries),
            tries,
            k,
            self._tokenizer.pad_token_id,
            num_beams=max(self.params.num_beams, k),
            end_token=self._tokenizer.eos_token_id,
            batch_size=self.params.eval_batch_size,
        )

    def generate(self, queries: Queries, k: int, constrained: bool) -> list[list[Output]]:
        """``max(num_beams, k)`` beams per query: free (``lm.generate``) or trie-constrained.

        Outputs name a real tool (``Output.tool``) or nothing; unconstrained decoding shows how often
        the model invents tools (ToolGen's hallucination rate), constrained decoding that it cannot.
        """
        if self._trie is None:
            raise RuntimeError(f"{self.name}: call index() before generate()")
        if constrained:
            beams = max(self.params.num_beams, k)
            return hits_to_outputs(self._constrained(queries, self._trie, beams), self.codebook)
        parser = OutputParser(self.codebook, self._tokenizer, {t: self._names[t] for t in self.tool_ids})
        return generate_outputs(
            self._lm,
            self._tokenizer,
            self._prompts(queries),
            parser,
            num_beams=max(self.params.num_beams, k),
            max_new_tokens=self.params.free_max_new_tokens,
            batch_size=max(1, self.params.eval_batch_size // 2),
        )

    # --- artifacts ------------------------------------------------------------------------

    def save(self, path: str) -> None:
        """``config.json`` (params, indexed tools, training report) + the LM bundle under ``lm/``."""
        if self._lm is None or self._trie is None:
            raise RuntimeError(f"{self.name}: nothing to save; fit/load and index first")
        write_config(
            path,
            {
                "method": self.name,
                "params": self.config(),
                "tool_ids": self.tool_ids,
                "tool_names": self._names,
                "added_after_training": self.added_after_training,
                "report": self.report,
                **self.save_extra(path),
            },
        )
        save_bundle(self._lm, self._tokenizer, self.codebook, os.path.join(path, "lm"))

    @classmethod
    def load(cls, path: str) -> CodeLMMethod:
        config = read_config(path)
        method = cls.from_dir(os.path.join(path, "lm"), config["params"])
        method.tool_ids = config["tool_ids"]
        method._names = config["tool_names"]
        method.added_after_training = config.get("added_after_training", [])
        method.report = config.get("report", {})
        method.load_extra(path, config)
        method._trie = method.codebook.trie(method.tool_ids)
        return method
