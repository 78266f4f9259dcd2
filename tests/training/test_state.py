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
