"""FSDP's wrapper keeps a task's parameter groups: a sub-module's own learning rate survives wrapping;
the reported training loss is every worker's mean, not rank 0's."""

from __future__ import annotations

import multiprocessing
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from components.methods.masstool.task import MassToolTask
from components.training.parallel import (
    WholeModel,
    fsdp_wrap,
    load_optimizer_state,
    mean_across_workers,
    optimizer_state,
)


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


class WithPool(Towers):
    """Towers with a buffer a task refreshes in validation, as MassTool re-embeds its search pool."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pool", torch.zeros(3, 8))


def test_buffers_validation_refreshes_in_the_whole_copy_reach_the_sharded_model(gloo_world_of_one):
    model = WithPool()
    whole = WholeModel(model, fsdp=True)
    wrapped = fsdp_wrap(model)
    whole(wrapped).pool.copy_(torch.ones(3, 8))  # validation refreshes the copy it is given
    whole.keep_buffers(wrapped)
    # The next gathered copy (the checkpoint's) and the module trained next epoch hold the
    # refreshed pool; before, the copy was reloaded with the training module's stale zeros.
    assert torch.equal(whole(wrapped).pool, torch.ones(3, 8))
    assert torch.equal(wrapped.module.pool, torch.ones(3, 8))


def _trained(wrap: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = fsdp_wrap(Towers()) if wrap else Towers()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_an_fsdp_optimizer_state_is_the_whole_models_and_loads_back(gloo_world_of_one):
    # What an FSDP checkpoint saves is the optimizer state one process training the whole model
    # holds (numbered parameters, whole moments), so any layout resumes from it.
    (wrapped, sharded_opt), (_, plain_opt) = _trained(True), _trained(False)
    saved, reference = optimizer_state(wrapped, sharded_opt), plain_opt.state_dict()
    assert [g["params"] for g in saved["param_groups"]] == [g["params"] for g in reference["param_groups"]]
    for i, values in reference["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(saved["state"][i][key], values[key]), (i, key)
    fresh, _ = _trained(True)
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-3)
    load_optimizer_state(fresh, fresh_opt, saved)
    again = optimizer_state(fresh, fresh_opt)
    assert again["param_groups"][0]["lr"] == 1e-2
    for i, values in saved["state"].items():
        assert torch.equal(again["state"][i]["exp_avg"], values["exp_avg"]), i


def _rank_mean(rank: int, store_file: str, losses: list[float], out) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_file, 2), rank=rank, world_size=2)
    try:
        out.put((rank, mean_across_workers(sum(losses), len(losses))))
    finally:
        dist.destroy_process_group()


def test_the_epoch_loss_is_the_mean_over_every_workers_batches(tmp_path):
    # Two gloo ranks, forked (no interpreter start-up): rank 0 saw 2 batches, rank 1 saw 3 others.
    # Each alone knows its own mean (2.0 and 20.0); the epoch's is over all five batches.
    shards = {0: [1.0, 3.0], 1: [10.0, 20.0, 30.0]}
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    store = str(tmp_path / "store")
    ranks = [ctx.Process(target=_rank_mean, args=(r, store, shards[r], out)) for r in shards]
    for p in ranks:
        p.start()
    means = dict(out.get(timeout=60) for _ in ranks)
    for p in ranks:
        p.join(timeout=60)
    assert [p.exitcode for p in ranks] == [0, 0]
    assert means == {0: pytest.approx(64.0 / 5), 1: pytest.approx(64.0 / 5)}
    assert mean_across_workers(4.0, 2) == 2.0  # no process group: the plain mean
