"""The LM stages of the methods that retrieve by generating tool codes (ToolGen, ToolWeaver).

ToolGen (arXiv 2410.03439) and ToolWeaver (arXiv 2601.21947) fine-tune one causal LM in stages: a
plain-text warm-up for a scratch LM, then memorization (document -> code), retrieval (query ->
code) and agent tuning (ReAct trajectories whose actions are codes). Each stage is one Ray Train run
that starts from the previous stage's best checkpoint. This is the training half of
:class:`components.methods.codelm.CodeLMMethod`; retrieval and artifacts live there.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, ClassVar

import ray

from components.data.types import Dataset
from components.generative import sequences as td
from components.generative.bundle import load_bundle
from components.generative.lm import build_causal_lm, lm_spec_from, save_causal_lm, to_inference_device
from components.generative.params import LM_STAGES, CodeLMParams
from components.generative.perplexity import perplexity
from components.training.inputs import share
from components.training.spec import RunSpec, StageConfig, StageInputs

# Read by the agent stage alone (components/generative/task.py).
AGENT_ONLY = ("agent_replay", "agent_valid_queries", "trajectory_max_length")


class CodeLMStages:
    """Training of a code-generating LM, stage by stage (the base of ``CodeLMMethod``)."""

    name: ClassVar[str]
    stages: ClassVar[tuple[str, ...]] = LM_STAGES
    task: ClassVar[str]  # import string of the LM stages' task
    params: CodeLMParams
    stage_dirs: dict[str, str]  # each stage's model on this machine
    _stage_sources: dict[str, str]  # the same, where workers read it (see inputs.share)
    report: dict[str, Any]
    _lm: Any
    _tokenizer: Any

    def use_model(self, model_dir: str, data: Dataset | None = None) -> None:
        """Load an LM stage output (the subclass's; the last stage ends with it)."""
        raise NotImplementedError

    def added_tokens(self) -> int:
        """How many tokens the method added to the LM's vocabulary."""
        raise NotImplementedError

    def before_stage(
        self, stage: str, init: str, source: str, data: Dataset, run: RunSpec
    ) -> tuple[str, str]:
        """The ``(local dir, worker-readable source)`` an LM stage starts from; by default the
        previous stage's output unchanged."""
        return init, source

    def initial_model(self, data: Dataset, run: RunSpec) -> str:
        """Where the warm-up starts: a hub name/path as is, or a small Llama built and saved here.

        The scratch tokenizer is trained on the known tools' documents and the training queries
        (tools unseen in a cold-start split are left out, as tools that do not exist yet).
        """
        spec = lm_spec_from(self.params.lm)
        if spec.name_or_path:
            return spec.name_or_path
        path = os.path.join(os.path.abspath(run.local_dir), f"{run.name}-init")
        texts = td.warmup_texts(data, data.known_tools(), self.params.tool_fields, None, run.seed)
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
            params=self.stage_params(stage),
            inputs=StageInputs(dataset=dataset, init_dir=init_dir),
            epochs=int(settings["epochs"]),
            lr=float(settings["lr"]),
            batch_size=int(settings["batch_size"]),
            weight_decay=float(settings.get("weight_decay", 0.0)),
            score="valid_score",
            progress=self.params.progress,
        )

    def stage_params(self, stage: str) -> CodeLMParams:
        """The params as ``stage`` reads them: its own loop settings, and the agent stage's settings
        only in that stage (the others get the defaults). A stage's checkpoints are resumed only
        under the settings they were written with (components/training/resume.py), and with every
        stage's settings in each, a changed agent learning rate made the finished memorization and
        retrieval stages of the same run unresumable, so all of them trained again."""
        own: dict[str, Any] = {"stages": {stage: self.params.stages[stage]}}
        if stage != "agent":
            defaults = {f.name: f.default for f in dataclasses.fields(self.params) if f.name in AGENT_ONLY}
            own.update(defaults)
        return dataclasses.replace(self.params, **own)

    def fit(self, stage: str, data: Dataset, run: RunSpec) -> dict[str, float]:
        """Run one LM stage on Ray Train from the previous stage's best checkpoint (``epochs: 0`` skips)."""
        from components.training.runner import run_stage

        if stage not in LM_STAGES:
            raise ValueError(f"{self.name} has stages {self.stages}, not {stage!r}")
        if self.params.engine == "vllm":
            # Each stage's model is scored in process; vLLM serves a saved LM, not one in training.
            raise ValueError(
                f"{self.name}: engine vllm decodes on a server of a saved LM; train on transformers and "
                "serve the artifact with lm_engine: vllm"
            )
        index = LM_STAGES.index(stage)
        if index == 0:
            init = self.initial_model(data, run)
            source = share(init, run, f"{run.name}-init")
        else:
            before = LM_STAGES[index - 1]
            if before not in self.stage_dirs:
                raise ValueError(f"{self.name}: stage {stage!r} starts from {before!r}; fit {before!r} first")
            init, source = self.stage_dirs[before], self._stage_sources[before]
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
