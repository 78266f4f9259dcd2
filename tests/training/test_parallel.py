"""FSDP's wrapper keeps a task's parameter groups: a sub-module's own learning rate survives wrapping."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from components.methods.masstool.task import MassToolTask
from components.training.parallel import fsdp_wrap


class Towers(torch.nn.Module):
    """MassTool's layout in miniature: a text encoder, a frozen part of it, and fresh heads."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        self.encoder[0].requires_grad_(False)  # frozen lower layer
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


@pytest.fixture
def gloo_world_of_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_masstools_encoder_group_keeps_its_learning_rate_under_fsdp(gloo_world_of_one):
    torch.manual_seed(0)
    wrapped = fsdp_wrap(Towers())
    task = SimpleNamespace(params=SimpleNamespace(encoder_lr=1e-4))  # param_groups reads only this
    groups = MassToolTask.param_groups(task, wrapped)
    # Before, FSDP flattened every parameter into the root: the encoder group came out empty and
    # was dropped, so the encoder trained at the heads' lr (and mixed frozen and trainable
    # parameters in one flat parameter are refused outright).
    assert len(groups) == 2 and groups[1]["lr"] == 1e-4
    encoder_shapes = sorted(tuple(p.shape) for p in groups[1]["params"])
    assert encoder_shapes == [(8,), (8, 8)]  # the trainable upper layer only
    optimizer = torch.optim.AdamW(groups, lr=1e-2)
    before = [p.detach().clone() for p in groups[1]["params"]]
    wrapped(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, groups[1]["params"], strict=True))
