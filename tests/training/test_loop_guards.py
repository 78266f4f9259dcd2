"""Guards of the training loop and checkpoint discovery that need no Ray run."""

from __future__ import annotations

import json
import os
from dataclasses import FrozenInstanceError, dataclass, replace

import pytest
import ray
import torch
from safetensors.torch import save_file

from components.encoders.retriever import BiEncoderParams
from components.training.checkpoints import best_of, file_sizes, latest, persisted, prune
from components.training.loop import make_loader, run_epoch
from components.training.resume import check_resumable, settings_fingerprint, settings_values
from components.training.spec import StageConfig, StageInputs, pack, unpack
from components.training.task import StageTask


class _NoOpTask(StageTask):
    """A task whose validation is never reached (the epoch fails first)."""


def stage(**changes) -> StageConfig:
    base = StageConfig(
        task="components.encoders.contrastive:ContrastiveTask",
        stage="contrastive",
        params=BiEncoderParams(encoder={"hidden_size": 64}, epochs=2),
        inputs=StageInputs(dataset=object(), init_dir="/store/init"),
        epochs=2,
        lr=1e-3,
        batch_size=32,
    )
    return replace(base, **changes)


def test_fingerprint_ignores_resumable_and_non_json_settings():
    base = stage()
    # More epochs, a progress bar, a report log, another dataset object: the same run, resumable.
    same = stage(
        epochs=5,
        progress=True,
        report_log="/tmp/x",
        params=BiEncoderParams(encoder={"hidden_size": 64}, epochs=5),
        inputs=StageInputs(dataset=object(), init_dir="/store/init"),
    )
    assert settings_fingerprint(base) == settings_fingerprint(same)
    assert settings_fingerprint(base) != settings_fingerprint(stage(lr=2e-3))
    nested = stage(params=BiEncoderParams(encoder={"hidden_size": 128}, epochs=2))
    assert settings_fingerprint(base) != settings_fingerprint(nested)
    assert settings_fingerprint(base) != settings_fingerprint(stage(precision="bf16"))
    check_resumable({"epoch": 0, "history": []}, base)  # checkpoints from before fingerprints: allowed
    check_resumable({"epoch": base.epochs - 1, "settings": settings_fingerprint(base)}, base)
    with pytest.raises(
        ValueError, match=f"already hold {base.epochs + 1} epochs, more than the {base.epochs}"
    ):
        check_resumable({"epoch": base.epochs, "settings": settings_fingerprint(base)}, base)
    check_resumable({"settings": settings_fingerprint(base)}, same)
    with pytest.raises(ValueError, match="other settings"):
        check_resumable({"settings": settings_fingerprint(base)}, stage(lr=2e-3))
    # Checkpoints keep the values too: the refusal names what changed.
    kept = {"settings": settings_fingerprint(base), "settings_values": settings_values(base)}
    with pytest.raises(ValueError, match=r"other settings \(lr, params.encoder.hidden_size differ\)"):
        check_resumable(kept, stage(lr=2e-3, params=BiEncoderParams(encoder={"hidden_size": 128}, epochs=2)))


def test_stage_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="import string"):
        stage(task="components.encoders.contrastive.ContrastiveTask")
    with pytest.raises(ValueError, match="precision"):
        stage(precision="fp8")
    with pytest.raises(ValueError, match="epochs and batch_size"):
        stage(batch_size=0)
    with pytest.raises(FrozenInstanceError):
        stage().lr = 1.0  # what the driver built is what every worker trains


def test_an_epoch_without_a_batch_is_an_error_not_loss_zero():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match="no training examples"):
        run_epoch(_NoOpTask(), model, optimizer, [], stage(batch_size=64), 0, show_bar=False)


class _CountingTask(StageTask):
    """Ten examples; records every example a batch carries."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def train_data(self) -> list[int]:
        return list(range(10))

    def collate(self, items: list[int]) -> dict[str, torch.Tensor]:
        return {"x": torch.tensor(items, dtype=torch.float32)}

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.seen += batch["x"].long().tolist()
        return model(batch["x"][:, None]).sum()


def test_a_stage_without_training_examples_is_a_clear_error():
    task = _CountingTask()
    task.train_data = lambda: []
    with pytest.raises(ValueError, match="contrastive: no training examples"):
        make_loader(task, stage(batch_size=4), world=1, generator=torch.Generator())


def test_an_epoch_trains_on_every_example_the_last_batch_smaller():
    # A one-epoch stage (an alignment round) never sees what the loader drops: 10 examples in
    # batches of 4 lost 2 to drop_last; kept as a last batch of 2, they would weigh as much as 4.
    task = _CountingTask()
    config = stage(batch_size=4, epochs=1)
    loader = make_loader(task, config, world=1, generator=torch.Generator().manual_seed(0))
    assert [len(b["x"]) for b in loader] == [4, 3, 3]  # all ten, no runt batch
    model = torch.nn.Linear(1, 1)
    task.validate = lambda m: {}
    run_epoch(task, model, torch.optim.AdamW(model.parameters()), loader, config, 0, show_bar=False)
    assert sorted(task.seen) == list(range(10))


def write_checkpoint(
    root,
    name,
    epoch,
    state_text=None,
    model_files=("weights.safetensors",),
    score=None,
    run="run",
    listed=False,
):
    """A checkpoint as the loop writes it; ``listed``: its trainer state lists the other files."""
    path = root / run / name
    (path / "model").mkdir(parents=True)
    for f in ("model_state.safetensors", "optimizer.safetensors", "rng_state.safetensors"):
        save_file({"w": torch.ones(4, 3)}, str(path / f))
    (path / "optimizer.json").write_text(json.dumps({"state": {}, "param_groups": []}))
    for f in model_files:
        save_file({"w": torch.ones(2)}, str(path / "model" / f))
    state = {"epoch": epoch, "history": [{"s": epoch if score is None else score}]}
    if listed:
        state["files"] = file_sizes(str(path))
    text = state_text if state_text is not None else json.dumps(state)
    (path / "trainer_state.json").write_text(text)
    return path


@pytest.mark.parametrize("lost", ["model/weights.safetensors", "rng_state.safetensors"])
def test_a_checkpoint_missing_a_whole_file_is_passed_over(tmp_path, lost):
    # Every file it has is whole, but the upload was cut before one arrived: resumed from, it lost
    # the RNG state silently, or handed the next stage a model directory without weights.
    write_checkpoint(tmp_path, "checkpoint_a", 0, listed=True)
    path = write_checkpoint(
        tmp_path, "checkpoint_b", 1, model_files=("meta.safetensors", "weights.safetensors"), listed=True
    )
    (path / lost).unlink()
    assert [os.path.basename(p) for p, _ in persisted(str(tmp_path), "run")] == ["checkpoint_a"]


def test_a_nan_epoch_is_never_the_best_nor_keeps_the_best_from_being_kept(tmp_path):
    for epoch, score in enumerate([float("nan"), 0.9, 0.5]):
        write_checkpoint(tmp_path, f"checkpoint_{epoch}", epoch, score=score)
    found = persisted(str(tmp_path), "run")
    assert best_of(found, "s")[1]["epoch"] == 1
    # Keep one (and the newest, for a resume): before, the NaN epoch 0 was kept and the best deleted.
    assert [state["epoch"] for _, state in prune(found, 1, "s")] == [1, 2]


def test_a_finished_run_restarted_with_fewer_epochs_is_refused(tmp_path):
    from components.training.runner import run_stage
    from components.training.spec import RunSpec

    # Nothing would train, and the best of its 6 epochs came back as a 3-epoch model.
    write_checkpoint(tmp_path, "checkpoint_5", 5, run="r-contrastive")
    run = RunSpec(name="r", storage_path=str(tmp_path), num_workers=0)
    with pytest.raises(ValueError, match="already hold 6 epochs, more than the 3 asked for"):
        run_stage(stage(epochs=3), run)


def test_persisted_skips_truncated_or_partial_checkpoints(tmp_path):
    write_checkpoint(tmp_path, "checkpoint_a", 0)
    write_checkpoint(tmp_path, "checkpoint_b", 1, state_text='{"epoch": 1, "hist')  # cut mid-upload
    write_checkpoint(tmp_path, "checkpoint_c", 2, model_files=())  # model dir still empty
    found = persisted(str(tmp_path), "run")
    assert [os.path.basename(p) for p, _ in found] == ["checkpoint_a"]


@pytest.mark.parametrize("listed", [True, False])
def test_a_symlinked_checkpoint_directory_is_found(tmp_path, listed):
    # A run assembled from another run's checkpoints by links: one listing of the run used to see
    # each linked checkpoint as one entry and pass it over as incomplete.
    write_checkpoint(tmp_path, "checkpoint_a", 0, listed=listed)
    kept = write_checkpoint(tmp_path, "checkpoint_b", 1, run="elsewhere", listed=listed)
    (tmp_path / "run" / "checkpoint_b").symlink_to(kept, target_is_directory=True)
    found = persisted(str(tmp_path), "run")
    assert [(os.path.basename(p), state["epoch"]) for p, state in found] == [
        ("checkpoint_a", 0),
        ("checkpoint_b", 1),
    ]
    assert latest(str(tmp_path), "run")[1]["epoch"] == 1
    # Pruned, the link goes and the checkpoint it points to stays (rmtree refused a link before).
    write_checkpoint(tmp_path, "checkpoint_c", 2, listed=listed)
    kept_now = prune(persisted(str(tmp_path), "run"), 1, "s")
    assert [os.path.basename(p) for p, _ in kept_now] == ["checkpoint_c"]
    assert not os.path.lexists(tmp_path / "run" / "checkpoint_b") and (kept / "trainer_state.json").exists()


@pytest.mark.parametrize("cut", ["model_state.safetensors", "optimizer.json", "model/weights.safetensors"])
def test_a_checkpoint_with_a_file_cut_short_is_passed_over_for_the_one_before(tmp_path, cut):
    # Ray uploads a checkpoint's files in no set order: the trainer state can land whole while
    # the weights are still short. A resume then falls back to the newest complete checkpoint.
    write_checkpoint(tmp_path, "checkpoint_a", 0)
    file = write_checkpoint(tmp_path, "checkpoint_b", 1) / cut
    file.write_bytes(file.read_bytes()[:-5])
    assert [os.path.basename(p) for p, _ in persisted(str(tmp_path), "run")] == ["checkpoint_a"]
    assert latest(str(tmp_path), "run")[1]["epoch"] == 0


def test_settings_added_later_keep_old_checkpoints_resumable_at_their_default():
    # A run written before `lora` and `grad_accumulation` existed hashed neither key.
    old = settings_fingerprint({"lr": 1e-3, "params": {"r": 1}})
    assert settings_fingerprint({"lr": 1e-3, "grad_accumulation": 1, "params": {"r": 1, "lora": {}}}) == old
    assert settings_fingerprint({"lr": 1e-3, "grad_accumulation": 2, "params": {"r": 1}}) != old
    assert settings_fingerprint({"lr": 1e-3, "params": {"r": 1, "lora": {"r": 8}}}) != old
    # Memory layout is not what is trained: a run may resume with checkpointing or FSDP switched on.
    assert settings_fingerprint(stage(gradient_checkpointing=True, parallel_strategy="fsdp")) == (
        settings_fingerprint(stage())
    )


def test_ray_train_s_controller_gets_the_params_by_reference_and_the_worker_gets_them_back(ray_session):
    # Each run's controller (a process of its own, started before any worker) receives Ray Train's
    # train_loop_config and only passes it on: holding the params dataclass, it imported the
    # method's model code (torch, transformers: ~2 s per run on 2 cores). A reference imports nothing.
    config = stage(inputs=StageInputs(dataset=None, init_dir="/store/init"))
    packed = pack(config)
    assert packed["stage"] == replace(config, params=None)
    assert isinstance(packed["params"], ray.ObjectRef)
    # The worker gets the very config back.
    assert unpack(packed) == config


def test_params_of_a_class_defined_in_a_script_travel_by_value(ray_session):
    # Through Ray's serializer, as the rest of the config: a params class from a notebook, a script's
    # __main__ or a function is not importable on a worker and must travel by value.
    @dataclass
    class Local:
        lr: float = 0.1

    config = stage(params=Local(0.5), inputs=StageInputs(dataset=None, init_dir="/store/init"))
    assert unpack(pack(config)).params.lr == 0.5
