"""A stage as plain PyTorch in this process, without Ray Train: the baseline that
``benchmarks/train_overhead.py`` measures Ray Train against, and a reference the determinism tests
compare Ray Train runs with.

The training itself is :mod:`components.training.loop`'s: the same task, batches, optimizer,
validation and per-epoch checkpoint files, only no trainer around them.
"""

from __future__ import annotations

import os

import torch

from components.training.loop import (
    build_model,
    build_optimizer,
    deterministic_kernels,
    make_loader,
    make_task,
    run_epoch,
    save_checkpoint,
)
from components.training.spec import StageConfig


def train_in_process(config: StageConfig, checkpoint_root: str) -> list[dict[str, float]]:
    """Train ``config`` here; each epoch's checkpoint is written under ``checkpoint_root/epoch_<n>``.

    Returns:
        The metrics of every epoch, as the Ray Train loop reports them.
    """
    with deterministic_kernels(bool(config.deterministic)):
        torch.manual_seed(int(config.seed))
        task = make_task(config)
        model = build_model(task, config)
        optimizer = build_optimizer(model, config, task)
        generator = torch.Generator()
        loader = make_loader(task, config, 1, generator)
        history: list[dict[str, float]] = []
        for epoch in range(int(config.epochs)):
            generator.manual_seed(int(config.seed) * 1000 + epoch)
            history.append(run_epoch(task, model, optimizer, loader, config, epoch, bool(config.progress)))
            path = os.path.join(checkpoint_root, f"epoch_{epoch}")
            os.makedirs(path, exist_ok=True)
            save_checkpoint(path, model, optimizer.state_dict(), task, epoch, history)
        return history
