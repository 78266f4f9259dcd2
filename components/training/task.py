"""The contract between a method's training stage and the generic Ray Train loop.

A method exposes ``stage_task(stage, config)`` returning a :class:`StageTask`; the loop in
:mod:`components.training.loop` does everything else (devices, DDP, samplers, optimizer,
checkpoints, resume, reporting), so every method trains the same way on CPU or GPU.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn


class StageTask(Protocol):
    """One training stage of one method, built inside each Ray Train worker."""

    def build_model(self) -> nn.Module:
        """The model at the start of the stage (fresh, or from the previous stage's checkpoint)."""
        ...

    def train_data(self) -> torch.utils.data.Dataset:
        """Training examples; the loop shards them across workers."""
        ...

    def collate(self, items: list[Any]) -> dict[str, Any]:
        """A batch from examples (tensors on CPU; the loop moves them to the device)."""
        ...

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """The scalar training loss of one batch."""
        ...

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Metrics on the validation split (never test); keys become ``valid_<name>``."""
        ...

    def save_model(self, model: nn.Module, path: str) -> None:
        """Write the model to ``path`` as config JSON + safetensors (a reloadable stage output)."""
        ...
