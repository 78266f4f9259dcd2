"""Train the local selector LM in-process: train queries → "tool name + arguments" (see :mod:`.callformat`).

A small Llama built here (:func:`components.generative.lm.build_causal_lm`, BPE trained on the
texts) or a pretrained LM by name/path is fine-tuned for a bounded number of steps with the
causal-LM loss on the call tokens only (the prompt is context, not target). Arguments are weak
labels (:mod:`.weak_args`): the datasets judge tools, not argument values.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict
from typing import Any

import torch

from components.data.types import Dataset
from components.generative.lm import LMSpec, build_causal_lm, lm_spec_from, save_causal_lm
from components.serving.callformat import PROMPT, CallFormat, format_value
from components.serving.catalog import Tool, ToolCatalog
from components.serving.weak_args import weak_arguments

Example = tuple[str, Tool, dict[str, Any]]


def selector_examples(
    dataset: Dataset, catalog: ToolCatalog, split: str = "train", limit: int | None = None, seed: int = 0
) -> list[Example]:
    """One (query, tool, weak arguments) per judged (query, tool) pair of ``split``, shuffled."""
    examples = [
        (dataset.queries[q], catalog.tools[t], weak_arguments(dataset.queries[q], catalog.tools[t]))
        for q, rel in dataset.qrels[split].items()
        for t, score in rel.items()
        if score > 0 and t in catalog.tools
    ]
    random.Random(seed).shuffle(examples)
    return examples[:limit] if limit else examples


def tokenizer_texts(examples: list[Example], catalog: ToolCatalog) -> list[str]:
    """What the BPE of a from-scratch model is trained on: prompts, every tool name, keys and values."""
    texts = [PROMPT.format(query=q) for q, _, _ in examples]
    texts += [t.name for t in catalog.tools.values()]
    texts += [f"{k} = {format_value(v)}" for _, _, args in examples for k, v in args.items()]
    return texts


def _batch(rows: list[tuple[list[int], list[int]]], pad: int) -> dict[str, torch.Tensor]:
    """Right-padded ids, mask, and labels that score only the call tokens."""
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), width), pad)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (prompt, target) in enumerate(rows):
        seq = prompt + target
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(prompt) : len(seq)] = torch.tensor(target)
        mask[i, : len(seq)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


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
) -> dict[str, Any]:
    """Fine-tune the selector LM for ``steps`` steps and save it to ``out_dir`` (HF layout).

    Returns:
        A report (also written to ``out_dir/selector.json``): examples, first/last loss, seconds.
    """
    spec = lm if isinstance(lm, LMSpec) else lm_spec_from(lm)
    examples = selector_examples(dataset, catalog, limit=max_examples, seed=seed)
    if not examples:
        raise ValueError(f"{dataset.name}: no train (query, tool) pairs whose tool is in the catalog")
    started = time.perf_counter()
    model, tokenizer = build_causal_lm(spec, tokenizer_texts(examples, catalog), seed=seed)
    fmt = CallFormat(tokenizer)
    budget = spec.max_length
    rows = []
    for query, tool, args in examples:
        target = fmt.target(tool, args)
        rows.append((fmt.prompt(query)[: max(1, budget - len(target))], target[:budget]))
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    model.train()
    losses = []
    for _ in range(steps):
        batch = _batch(rng.sample(rows, min(batch_size, len(rows))), tokenizer.pad_token_id)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    model.eval()
    save_causal_lm(model, tokenizer, out_dir)
    window = max(1, min(10, steps // 5))
    report = {
        "dataset": dataset.name,
        "examples": len(examples),
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "lm": asdict(spec),
        "first_loss": sum(losses[:window]) / window,
        "last_loss": sum(losses[-window:]) / window,
        "seconds": time.perf_counter() - started,
    }
    with open(os.path.join(out_dir, "selector.json"), "w") as f:
        json.dump(report, f, indent=2)
    return report
