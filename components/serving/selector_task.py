"""The selector LM's training stage, run by the one Ray Train runner like every method stage.

Examples are (prompt ids, call ids) rows built from the train split (:mod:`.selector_train`); the
loss is the causal-LM loss on the call tokens only (the prompt is context, not target), and each
epoch is validated by the same loss on valid rows, reported as ``valid_neg_loss`` (higher is
better) to rank checkpoints.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import ray
import torch
from torch import nn

from components.data import io
from components.generative.lm import load_causal_lm, save_causal_lm
from components.serving.callformat import CallFormat
from components.serving.catalog import Tool, ToolCatalog
from components.serving.weak_args import weak_arguments
from components.training.spec import StageConfig
from components.training.task import StageTask

TASK = "components.serving.selector_task:SelectorTask"
Example = tuple[str, Tool, dict[str, Any]]


@dataclass
class SelectorParams:
    """What the selector stage trains on (the optimisation settings are the StageConfig's)."""

    catalog: ToolCatalog
    rows_per_epoch: int  # batches per epoch x batch size: rows are cycled to fill an epoch
    max_examples: int | None = 20000
    valid_rows: int = 256
    max_length: int = 128  # the LM's context budget: prompt + call


def selector_examples(
    dataset: Any, catalog: ToolCatalog, split: str = "train", limit: int | None = None, seed: int = 0
) -> list[Example]:
    """One (query, tool, weak arguments) per judged (query, tool) pair of ``split``, shuffled."""
    examples = [
        (dataset.queries[q], catalog.tools[t], weak_arguments(dataset.queries[q], catalog.tools[t]))
        for q, rel in dataset.qrels.get(split, {}).items()
        for t, score in rel.items()
        if score > 0 and t in catalog.tools
    ]
    random.Random(seed).shuffle(examples)
    return examples[:limit] if limit else examples


def call_rows(examples: list[Example], fmt: CallFormat, budget: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, call ids) per example, the prompt cut (from the start of its text, as serving
    cuts it: :meth:`CallFormat.prompt`) so that the call fits the budget."""
    rows = []
    for query, tool, args in examples:
        target = fmt.target(tool, args)
        rows.append((fmt.prompt(query, max(2, budget - len(target))), target[:budget]))
    return rows


def call_batch(rows: list[tuple[list[int], list[int]]], pad: int) -> dict[str, torch.Tensor]:
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


class EpochWindow(torch.utils.data.Dataset):
    """Epoch ``e``'s ``rows_per_epoch`` rows: the task's shuffled rows from ``e * rows_per_epoch``
    on, cycled. An epoch is a chosen number of steps, whatever the size of the train split; the
    first ``rows_per_epoch`` rows every epoch trained on 960 of 20,000 examples five times over,
    where moving on sees 4,800 distinct ones (and a small split cycles as before)."""

    def __init__(self, task: SelectorTask) -> None:
        self.task = task

    def __len__(self) -> int:
        return self.task.params.rows_per_epoch

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        rows = self.task.rows
        return rows[(self.task.epoch * len(self) + i) % len(rows)]


class SelectorTask(StageTask):
    """Fine-tune the selector LM in ``config.inputs.init_dir`` on calls of the train split."""

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self.params: SelectorParams = config.params
        data = config.inputs.dataset
        self.data = ray.get(data) if isinstance(data, ray.ObjectRef) else data
        self.epoch = 0  # which rows train_data's window reads (start_epoch moves it)

    def build_model(self) -> nn.Module:
        assert self.config.inputs.init_dir is not None, "the selector stage starts from a saved LM"
        model, self.tokenizer = load_causal_lm(
            io.fetch(self.config.inputs.init_dir, self.config.storage_options)
        )
        fmt = CallFormat(self.tokenizer)
        p = self.params
        train = selector_examples(self.data, p.catalog, "train", p.max_examples, self.config.seed)
        valid = selector_examples(self.data, p.catalog, "valid", p.valid_rows, self.config.seed)
        self.rows = call_rows(train, fmt, p.max_length)
        self.valid = call_rows(valid, fmt, p.max_length)
        return model

    def train_data(self) -> torch.utils.data.Dataset:
        return EpochWindow(self)

    def start_epoch(self, model: nn.Module, epoch: int) -> None:
        self.epoch = epoch  # moves the window train_data reads (the loader reads it lazily)

    def collate(self, items: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        return call_batch(items, self.tokenizer.pad_token_id)

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(**batch).loss

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        rows = self.valid or self.rows[: self.params.valid_rows]  # a dataset with no valid split
        device = next(model.parameters()).device
        losses = []
        for i in range(0, len(rows), 32):
            batch = {
                k: v.to(device) for k, v in call_batch(rows[i : i + 32], self.tokenizer.pad_token_id).items()
            }
            losses.append(float(model(**batch).loss) * len(rows[i : i + 32]))
        return {"neg_loss": -sum(losses) / max(len(rows), 1)}

    def save_model(self, model: nn.Module, path: str) -> None:
        save_causal_lm(model, self.tokenizer, path)
