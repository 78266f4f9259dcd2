"""Batches for the training loop: every example once an epoch, in batches as even as possible."""

from __future__ import annotations

from collections.abc import Iterator

import torch


class EvenBatches(torch.utils.data.Sampler[list[int]]):
    """The order ``sampler`` draws, cut into ``ceil(n / batch_size)`` batches whose sizes differ by
    at most one: every example ``sampler`` draws once an epoch, and no runt last batch (10 examples
    in batches of 4 give 4 + 3 + 3, not 4 + 4 + 2, nor 4 + 4 with two dropped)."""

    def __init__(self, sampler: torch.utils.data.Sampler[int], batch_size: int) -> None:
        self.sampler = sampler
        self.batch_size = batch_size

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        order, count = list(self.sampler), len(self)
        size, extra = divmod(len(order), max(count, 1))
        start = 0
        for i in range(count):
            end = start + size + (i < extra)
            yield order[start:end]
            start = end

    def set_epoch(self, epoch: int) -> None:
        """A ``DistributedSampler``'s shuffle for ``epoch``."""
        self.sampler.set_epoch(epoch)
