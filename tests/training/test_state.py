"""Optimizer and trainer state round-trip through safetensors + JSON (no pickle)."""

from __future__ import annotations

import os

import torch

from components.training.state import load_optimizer, load_trainer_state, save_optimizer, save_trainer_state


def test_adamw_state_round_trip(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
    save_optimizer(opt, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["optimizer.json", "optimizer.safetensors"]
    fresh = torch.optim.AdamW(model.parameters(), lr=1.0)
    load_optimizer(fresh, str(tmp_path))
    a, b = opt.state_dict(), fresh.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for pid in a["state"]:
        for key, value in a["state"][pid].items():
            torch.testing.assert_close(torch.as_tensor(value), torch.as_tensor(b["state"][pid][key]))


def test_trainer_state(tmp_path):
    save_trainer_state(str(tmp_path), 2, [{"epoch": 0}, {"epoch": 1}, {"epoch": 2}])
    assert load_trainer_state(str(tmp_path)) == {
        "epoch": 2,
        "history": [{"epoch": 0}, {"epoch": 1}, {"epoch": 2}],
    }


def test_trainer_state_keeps_the_settings_fingerprint(tmp_path):
    save_trainer_state(str(tmp_path), 0, [{"epoch": 0}], settings="abc")
    assert load_trainer_state(str(tmp_path))["settings"] == "abc"


def test_each_rank_resumes_its_own_generator_state(tmp_path):
    # Only rank 0's state was saved and every rank restored it: a rank whose batch shapes differ
    # had drawn other dropout masks, and after a resume it drew rank 0's.
    from components.training.state import load_rng_state, rng_state, save_rng_state

    states = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        torch.rand(seed * 10)  # each rank draws for its own shapes
        states.append(rng_state())
    save_rng_state(str(tmp_path), states)
    for rank in (0, 1, 2):
        torch.manual_seed(99)
        load_rng_state(str(tmp_path), rank)
        assert torch.equal(torch.get_rng_state(), states[rank]["cpu"]), rank
    load_rng_state(str(tmp_path), 5)  # more workers than when saved: rank 0's, as before
    assert torch.equal(torch.get_rng_state(), states[0]["cpu"])
    # One worker's file is as it always was: a checkpoint written before loads unchanged.
    save_rng_state(str(tmp_path), states[:1])
    load_rng_state(str(tmp_path), 1)
    assert torch.equal(torch.get_rng_state(), states[0]["cpu"])
