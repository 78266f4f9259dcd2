"""Guards of the training loop and checkpoint discovery that need no Ray run."""

from __future__ import annotations

import json
import os

import pytest
import torch

from components.training.checkpoints import persisted
from components.training.loop import check_resumable, run_epoch, settings_fingerprint


def test_fingerprint_ignores_resumable_and_non_json_settings():
    params = {"encoder": {"hidden_size": 64}, "epochs": 2}
    base = {"lr": 1e-3, "batch_size": 32, "params": params, "epochs": 2}
    same = {**base, "epochs": 5, "progress": True, "dataset": object(), "report_log": "/tmp/x"}
    same["params"] = {**base["params"], "epochs": 5}
    assert settings_fingerprint(base) == settings_fingerprint(same)
    assert settings_fingerprint(base) != settings_fingerprint({**base, "lr": 2e-3})
    nested = {**base, "params": {"encoder": {"hidden_size": 128}, "epochs": 2}}
    assert settings_fingerprint(base) != settings_fingerprint(nested)
    check_resumable({"epoch": 0, "history": []}, base)  # checkpoints from before fingerprints: allowed
    check_resumable({"settings": settings_fingerprint(base)}, same)
    with pytest.raises(ValueError, match="other settings"):
        check_resumable({"settings": settings_fingerprint(base)}, {**base, "lr": 2e-3})


def test_an_epoch_without_a_batch_is_an_error_not_loss_zero():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    config = {"stage": "contrastive", "batch_size": 64}
    with pytest.raises(ValueError, match="no full training batch"):
        run_epoch(object(), model, optimizer, [], config, 0, show_bar=False)


def write_checkpoint(root, name, epoch, state_text=None, model_files=("weights",)):
    path = root / "run" / name
    (path / "model").mkdir(parents=True)
    for f in ("model_state.safetensors", "optimizer.json", "optimizer.safetensors"):
        (path / f).write_text("x")
    for f in model_files:
        (path / "model" / f).write_text("x")
    text = state_text if state_text is not None else json.dumps({"epoch": epoch, "history": [{"s": epoch}]})
    (path / "trainer_state.json").write_text(text)


def test_persisted_skips_truncated_or_partial_checkpoints(tmp_path):
    write_checkpoint(tmp_path, "checkpoint_a", 0)
    write_checkpoint(tmp_path, "checkpoint_b", 1, state_text='{"epoch": 1, "hist')  # cut mid-upload
    write_checkpoint(tmp_path, "checkpoint_c", 2, model_files=())  # model dir still empty
    found = persisted(str(tmp_path), "run")
    assert [os.path.basename(p) for p, _ in found] == ["checkpoint_a"]
