"""Train the local selector LM: train queries → "tool name + arguments" (see :mod:`.callformat`).

A small Llama built here (:func:`components.generative.lm.build_causal_lm`, BPE trained on the
texts) or a pretrained LM by name/path is fine-tuned for a bounded number of steps with the
causal-LM loss on the call tokens only (the prompt is context, not target), as one stage of the
one Ray Train runner (:mod:`.selector_task`). Arguments are weak labels (:mod:`.weak_args`): the
datasets judge tools, not argument values.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict
from typing import Any

import ray

from components.data.types import Dataset
from components.generative.lm import LMSpec, build_causal_lm, lm_spec_from, save_causal_lm
from components.serving.callformat import PROMPT, format_value
from components.serving.catalog import ToolCatalog
from components.serving.selector_task import TASK, Example, SelectorParams, selector_examples
from components.training.inputs import share
from components.training.runner import run_stage
from components.training.spec import RunSpec, StageConfig, StageInputs

EPOCHS = 5  # the steps are split into this many epochs: a checkpoint and a valid loss each


def tokenizer_texts(examples: list[Example], catalog: ToolCatalog) -> list[str]:
    """What the BPE of a from-scratch model is trained on: prompts, every tool name, keys and values."""
    texts = [PROMPT.format(query=q) for q, _, _ in examples]
    texts += [t.name for t in catalog.tools.values()]
    texts += [f"{k} = {format_value(v)}" for _, _, args in examples for k, v in args.items()]
    return texts


def train_selector_lm(
    dataset: Dataset,
    catalog: ToolCatalog,
    out_dir: str,
    lm: dict[str, Any] | LMSpec | None = None,
    steps: int = 300,
    batch_size: int = 16,
    lr: float = 3e-3,
    max_examples: int | None = 20000,
    seed: int = 0,
    run: RunSpec | None = None,
) -> dict[str, Any]:
    """Fine-tune the selector LM for about ``steps`` optimizer steps on Ray Train; save the best
    epoch's model (by valid loss) to ``out_dir`` (HF layout).

    Args:
        run: Where the Ray Train run lives; by default beside ``out_dir`` (``<out_dir>.train``).

    Returns:
        A report (also written to ``out_dir/selector.json``): examples, first/last epoch loss, seconds.
    """
    spec = lm if isinstance(lm, LMSpec) else lm_spec_from(lm)
    examples = selector_examples(dataset, catalog, limit=max_examples, seed=seed)
    if not examples:
        raise ValueError(f"{dataset.name}: no train (query, tool) pairs whose tool is in the catalog")
    started = time.perf_counter()
    out_dir = os.path.abspath(out_dir)
    run = run or RunSpec(
        name="selector", storage_path=f"{out_dir}.train", local_dir=f"{out_dir}.train/local", seed=seed
    )
    init = os.path.join(run.local_dir, f"{run.name}-init")
    if spec.name_or_path:
        init = spec.name_or_path
    else:
        model, tokenizer = build_causal_lm(spec, tokenizer_texts(examples, catalog), seed=seed)
        save_causal_lm(model, tokenizer, init)
    epochs = max(1, min(EPOCHS, steps))
    per_epoch = max(1, round(steps / epochs))
    params = SelectorParams(
        catalog=catalog,
        rows_per_epoch=per_epoch * batch_size,
        max_examples=max_examples,
        max_length=spec.max_length,
    )
    stage = StageConfig(
        task=TASK,
        stage="selector",
        params=params,
        inputs=StageInputs(ray.put(dataset), share(init, run, f"{run.name}-init")),
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        weight_decay=0.01,
        warmup_steps=max(1, steps // 10),
        score="valid_neg_loss",
    )
    result = run_stage(stage, run)
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.copytree(result.model_dir, out_dir)
    report = {
        "dataset": dataset.name,
        "examples": len(examples),
        "steps": epochs * per_epoch,
        "batch_size": batch_size,
        "lr": lr,
        "lm": asdict(spec),
        "first_loss": result.history[0]["train_loss"],
        "last_loss": result.history[-1]["train_loss"],
        "valid_loss": -result.metrics["valid_neg_loss"],
        "seconds": time.perf_counter() - started,
    }
    with open(os.path.join(out_dir, "selector.json"), "w") as f:
        json.dump(report, f, indent=2)
    return report
