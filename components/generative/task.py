"""The LM stages of a code-generating retriever, built inside each Ray Train worker.

ToolGen (arXiv 2410.03439, Sec. 3.2) and ToolWeaver (arXiv 2601.21947) train one causal LM
through the same stages: a plain-text warm-up (scratch LMs only), memorization (tool document ->
code), retrieval (query -> code) and agent tuning (trajectories whose actions are codes). Every
stage starts from the previous stage's output directory (``init_dir``). A method whose codes must be
created inside the worker overrides :meth:`CodeLMTask.add_codes` (ToolGen adds one token per tool
there, idempotently); ToolWeaver's driver writes its codes into the bundle before the first stage
that needs them, so the base class adds nothing.

This module matches :class:`components.training.task.StageTask` by implementing all its methods
(the generative layer does not import the training layer).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import ray
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from components.data import io
from components.data.types import Dataset
from components.generative import sequences as td
from components.generative.bundle import load_bundle, save_bundle
from components.generative.constrained import Hits, constrained_top_k
from components.generative.hallucination import OutputParser, generate_outputs, outputs_to_results
from components.generative.lm import lm_spec_from
from components.generative.lora import add_lora, is_adapted, save_adapter_beside
from components.generative.params import CodeLMParams
from components.generative.perplexity import perplexity
from components.generative.targeted import LMExample, TargetedLM, collate_examples, targets_loss
from components.generative.tool_tokens import ToolCodebook
from components.metrics import EPOCH_METRICS, evaluate_retrieval

if TYPE_CHECKING:
    from components.training.spec import StageConfig

STAGE_FILE = "codelm_stage.json"


class CodeLMTask:
    """One LM stage (``config.stage``): data, loss, validation and the saved output."""

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self.stage: str = config.stage
        self.params: CodeLMParams = config.params
        self.settings = self.params.stages[self.stage]
        data = config.inputs.dataset
        self.data: Dataset = ray.get(data) if isinstance(data, ray.ObjectRef) else data
        self.seed = int(config.seed)
        self.tools = self.data.known_tools()
        self.examples: list[LMExample] = []

    def build_model(self) -> TargetedLM:
        dtype = lm_spec_from(self.params.lm).dtype
        assert self.config.inputs.init_dir is not None, "every LM stage starts from a saved LM"
        source = io.fetch(self.config.inputs.init_dir, self.config.storage_options)
        lm, self.tokenizer, self.codebook = load_bundle(source, dtype)
        if self.stage != "warmup":
            self.add_codes(lm, self.tokenizer, self.codebook)
            missing = [t for t in self.tools if t not in self.codebook]
            if missing:
                raise ValueError(
                    f"{self.params.method} {self.stage}: {len(missing)} known tools have no code in "
                    f"{self.config.inputs.init_dir} (e.g. {missing[:3]})"
                )
            spec = self.params.lora_spec()
            if spec is not None:
                # Only the adapter and the code-token rows train; the base LM stays as it was.
                lm = add_lora(lm, spec, trainable_tokens=self.codebook.token_ids())
        self.prompter = td.Prompter(self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id
        # Examples need the tokenizer (and the tool tokens), so they are built here, once.
        self.examples = self._examples()
        return TargetedLM(lm)

    def add_codes(
        self, lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, codebook: ToolCodebook
    ) -> None:
        """Give every known tool its code before the first tool stage (idempotent); a no-op here."""

    def _sample(self, items: list, limit: int | None) -> list:
        if limit is None or len(items) <= limit:
            return items
        return random.Random(self.seed).sample(items, limit)

    def _examples(self) -> list[LMExample]:
        p, limit = self.params, self.settings.get("max_examples")
        if self.stage == "warmup":
            texts = td.warmup_texts(self.data, self.tools, p.tool_fields, limit, self.seed)
            encoded = self.tokenizer(texts, truncation=True, max_length=p.document_max_length)["input_ids"]
            return [LMExample.language_model(ids) for ids in encoded if len(ids) > 1]
        if self.stage == "memorization":
            docs = td.tool_documents(self.data.corpus, self.tools, p.tool_fields)
            return self._sample(
                td.memorization_examples(self.prompter, docs, self.codebook, p.document_max_length), limit
            )
        retrieval = td.retrieval_examples(
            self.prompter, self.data.queries, self.data.qrels["train"], self.codebook, p.query_max_length
        )
        if self.stage == "retrieval":
            return self._sample(retrieval, limit)
        trajectories = td.agent_examples(
            self.prompter, self.data, "train", self.codebook, p.trajectory_max_length, limit, self.seed
        )
        agent = [e for e, _, _ in trajectories]
        replay = self._sample(retrieval, round(p.agent_replay * len(trajectories)))
        # A trajectory has ~20x the targets of a retrieval example; weigh each replayed query as
        # much as one trajectory, or the replay barely counts in the per-target mean loss.
        per_trajectory = sum(len(e.targets) for e in agent) / max(len(agent), 1)
        for example in replay:
            example.weight = per_trajectory / len(example.targets)
        return agent + replay

    def train_data(self) -> list[LMExample]:
        return self.examples

    def collate(self, items: list[LMExample]) -> dict[str, torch.Tensor]:
        return collate_examples(items, self.pad_id)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return targets_loss(model, batch)

    def validate(self, model: torch.nn.Module) -> dict[str, float]:
        """Valid-split metrics; ``score`` ranks the stage's checkpoints (higher is better)."""
        p = self.params
        if self.stage == "warmup":
            ppl = perplexity(
                model.lm, self.tokenizer, self._valid_texts(), p.query_max_length, p.eval_batch_size
            )
            return {"perplexity": ppl, "score": -ppl}
        if self.stage == "memorization":
            accuracy = self.memorization_accuracy(model)
            return {"memorization_acc": accuracy, "score": accuracy}
        out = self.retrieval_metrics(model)
        if is_adapted(model.lm):
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            out["trainable_fraction"] = trainable / sum(p.numel() for p in model.parameters())
        if self.stage == "retrieval":
            return {**out, "score": out[p.select_metric]}
        out["agent_tool_acc"] = self.agent_accuracy(model)
        # Agent tuning serves both uses of the model, so its checkpoints are ranked by both.
        return {**out, "score": (out["agent_tool_acc"] + out[p.select_metric]) / 2}

    def _valid_texts(self) -> list[str]:
        qids = list(self.data.qrels["valid"])[: self.params.perplexity_texts or None]
        return [self.data.queries[q] for q in qids]

    def top_k(self, model: TargetedLM, prompts: list[list[int]], k: int) -> list[Hits]:
        """The top-``k`` catalog tools per prompt, decoded as retrieval decodes them (``max(num_beams,
        k)`` beams, the end token): checkpoints are then ranked by the decoder that is served. (With
        ``k`` beams, a greedy top-1 for ``k`` = 1, a multi-token code whose first token is likelier
        can win over the code of higher total probability that retrieval returns.)"""
        return constrained_top_k(
            model,
            prompts,
            self.codebook.trie(self.tools),
            k,
            self.pad_id,
            num_beams=self.params.num_beams,
            end_token=self.tokenizer.eos_token_id,
            batch_size=self.params.eval_batch_size,
        )

    def memorization_accuracy(self, model: TargetedLM) -> float:
        """Share of tool documents whose constrained top-1 tool is their own tool."""
        docs = td.tool_documents(self.data.corpus, self.tools, self.params.tool_fields)
        prompts = [self.prompter.memorization(d, self.params.document_max_length) for d in docs.values()]
        hits = self.top_k(model, prompts, 1)
        return sum(bool(h) and h[0][0] == t for t, h in zip(docs, hits, strict=True)) / max(len(docs), 1)

    def retrieval_metrics(self, model: TargetedLM) -> dict[str, float]:
        """Retrieval on (a prefix of) the valid queries, decoded as ``decoding`` serves them
        (constrained beams, or free beams whose outputs name a tool or nothing): recall@3/5, ndcg@3."""
        qrels = dict(list(self.data.qrels["valid"].items())[: self.params.valid_queries])
        qids = list(qrels)
        prompts = [self.prompter.retrieval(self.data.queries[q], self.params.query_max_length) for q in qids]
        if self.params.decoding == "unconstrained":
            # The model ``decoding: unconstrained`` serves is the one whose free beams rank best,
            # invented tools and all; ranking checkpoints by the trie would choose another.
            # Every catalog tool is real, as for the served method once it indexes the corpus.
            names = td.tool_names(self.data.corpus, list(self.data.corpus))
            parser = OutputParser(self.codebook, self.tokenizer, names)
            outputs = generate_outputs(
                model.lm, self.tokenizer, prompts, parser, **self.params.free_decoding(5)
            )
            results = outputs_to_results(qids, outputs, 5)
        else:
            hits = self.top_k(model, prompts, 5)
            results = {q: dict(h) for q, h in zip(qids, hits, strict=True)}
        metrics = evaluate_retrieval(qrels, results, (3, 5))
        return {m: metrics[m] for m in EPOCH_METRICS}

    def agent_accuracy(self, model: TargetedLM) -> float:
        """Teacher-forced agent steps: share of ``Action:`` positions whose top-1 tool is the gold one.

        The thoughts before the actions are blind (:data:`~components.generative.sequences.BLIND_THOUGHT`):
        a training thought begins the gold tool's description, and scored after it, the accuracy
        measured description-to-token lookup, not choosing a tool for the query.
        """
        p = self.params
        trajectories = td.agent_examples(
            self.prompter,
            self.data,
            "valid",
            self.codebook,
            p.trajectory_max_length,
            p.agent_valid_queries,
            blind=True,
        )
        prompts, gold = [], []
        for example, positions, tools in trajectories:
            prompts += [example.ids[: pos + 1] for pos in positions]
            gold += tools
        hits = self.top_k(model, prompts, 1)
        return sum(bool(h) and h[0][0] == g for g, h in zip(gold, hits, strict=True)) / max(len(gold), 1)

    def save_model(self, model: torch.nn.Module, path: str) -> None:
        # The adapter (LoRA matrices + trained code rows) beside the merged LM read like any bundle.
        save_bundle(save_adapter_beside(model.lm, path), self.tokenizer, self.codebook, path)
        # Provenance: which stage wrote this and what it started from (the previous stage's output).
        with open(os.path.join(path, STAGE_FILE), "w") as f:
            json.dump({"stage": self.stage, "init_dir": self.config.inputs.init_dir}, f)

    # StageTask's hooks, with its defaults.
    def param_groups(self, model: torch.nn.Module) -> Iterable[Any]:
        return model.parameters()

    def start_epoch(self, model: torch.nn.Module, epoch: int) -> None:
        pass
