"""The contract between a stage's task and the generic Ray Train loop.

A method names its stage's task by import string in :class:`components.training.spec.StageConfig`;
each worker builds it with that config, and :mod:`components.training.loop` does everything else
(devices, DDP, samplers, optimizer, precision, checkpoints, resume, reporting), so every stage of
every method trains the same way on CPU or GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class StageTask(Protocol):
    """One training stage, built inside each Ray Train worker from its
    :class:`components.training.spec.StageConfig` (``Task(config)``).

    A task subclasses this protocol and implements the six steps; the two hooks have defaults
    that do nothing special, so it overrides them only where it needs them. (A class that cannot
    import this package, such as the shared contrastive task in ``components.encoders``, matches
    the protocol by implementing all eight.)
    """

    def build_model(self) -> nn.Module:
        """The model at the start of the stage (fresh, or from the previous stage's output)."""
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

    # Hooks with defaults.
    def param_groups(self, model: nn.Module) -> Iterable[Any]:
        """What the optimizer trains: every parameter, by default; a task may return groups, e.g.
        a smaller learning rate for a pretrained encoder than for fresh heads."""
        return model.parameters()

    def start_epoch(self, model: nn.Module, epoch: int) -> None:
        """Called before each epoch's batches (e.g. to refresh embeddings a task caches)."""
