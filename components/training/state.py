"""Checkpoint files without pickle: model weights and optimizer state as safetensors + JSON.

``torch.save`` would pickle the optimizer state; instead its tensors go to safetensors under
flat names and everything else (step counts, hyper-parameters) to JSON.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors.torch import load_file, save_file

TRAINER_STATE = "trainer_state.json"
OPTIMIZER_TENSORS = "optimizer.safetensors"
OPTIMIZER_META = "optimizer.json"
RNG_STATE = "rng_state.safetensors"


def rng_state() -> dict[str, torch.Tensor]:
    """This process's torch CPU (and CUDA) generator states."""
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states |= {f"cuda_{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())}
    return states


def save_rng_state(path: str, per_rank: list[dict[str, torch.Tensor]] | None = None) -> None:
    """Every worker's generator states (``per_rank``; default: this process's alone): a resumed run
    then draws the same dropout and edge-dropout masks as one that was never interrupted. Rank
    0's under plain names, as one worker's always were; rank ``r``'s under ``rank<r>.``: each
    rank draws for its own batch shapes, so restoring rank 0's state on every rank (as before)
    changed the masks of every other rank."""
    states: dict[str, torch.Tensor] = {}
    for rank, own in enumerate(per_rank or [rng_state()]):
        states |= {(f"rank{rank}.{k}" if rank else k): v for k, v in own.items()}
    save_file(states, os.path.join(path, RNG_STATE))


def load_rng_state(path: str, rank: int = 0) -> None:
    """Restore this ``rank``'s states from :func:`save_rng_state`'s file (rank 0's where the run had
    fewer workers when saved); checkpoints written before the file existed are skipped."""
    file = os.path.join(path, RNG_STATE)
    if not os.path.exists(file):
        return
    states = load_file(file)
    prefix = f"rank{rank}." if rank and f"rank{rank}.cpu" in states else ""
    states = {
        k[len(prefix) :]: v for k, v in states.items() if k.startswith(prefix) and "." not in k[len(prefix) :]
    }
    torch.set_rng_state(states["cpu"])
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    saved = sum(k.startswith("cuda_") for k in states)
    if gpus and saved == gpus:  # the same device count as when saved; in device order (not cuda_10 < cuda_2)
        torch.cuda.set_rng_state_all([states[f"cuda_{i}"] for i in range(gpus)])


def save_optimizer(optimizer: torch.optim.Optimizer, path: str) -> None:
    """Write an optimizer's state dict as ``optimizer.safetensors`` + ``optimizer.json``."""
    write_optimizer(optimizer.state_dict(), path)


def write_optimizer(state: dict[str, Any], path: str) -> None:
    """Write an optimizer state dict (parameters numbered in group order) as
    ``optimizer.safetensors`` + ``optimizer.json``; :func:`read_optimizer` reads it back."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, values in state["state"].items():
        for key, value in values.items():
            if torch.is_tensor(value):
                # Cloned: FSDP's gathered state holds views into one flat buffer, and safetensors
                # refuses tensors that share storage.
                tensors[f"{pid}.{key}"] = value.detach().cpu().clone()
            else:
                scalars.setdefault(str(pid), {})[key] = value
    save_file(tensors, os.path.join(path, OPTIMIZER_TENSORS))
    with open(os.path.join(path, OPTIMIZER_META), "w") as f:
        json.dump({"param_groups": state["param_groups"], "scalars": scalars}, f)


def load_optimizer(optimizer: torch.optim.Optimizer, path: str) -> None:
    """Restore what :func:`save_optimizer` wrote into ``optimizer``."""
    optimizer.load_state_dict(read_optimizer(path))


def read_optimizer(path: str) -> dict[str, Any]:
    """The optimizer state dict :func:`save_optimizer` wrote."""
    with open(os.path.join(path, OPTIMIZER_META)) as f:
        meta = json.load(f)
    state: dict[int, dict[str, Any]] = {}
    for name, tensor in load_file(os.path.join(path, OPTIMIZER_TENSORS)).items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = tensor
    for pid, values in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(values)
    # JSON turned tuples (Adam's betas) into lists; "params" is the one list that must stay a list.
    groups = [
        {k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()}
        for g in meta["param_groups"]
    ]
    return {"state": state, "param_groups": groups}


def save_trainer_state(
    path: str,
    epoch: int,
    history: list[dict[str, float]],
    settings: str | None = None,
    files: dict[str, int] | None = None,
    settings_values: Any = None,
) -> None:
    """The epoch just finished, the metrics of every epoch so far, the settings' fingerprint and
    ``files``, the size of every other file of the checkpoint by its relative path (a copy missing
    one is then told from a whole one, see :func:`components.training.checkpoints.persisted`)."""
    state: dict[str, Any] = {"epoch": epoch, "history": history}
    if settings is not None:
        state["settings"] = settings
    if settings_values is not None:
        state["settings_values"] = settings_values
    if files is not None:
        state["files"] = files
    with open(os.path.join(path, TRAINER_STATE), "w") as f:
        json.dump(state, f, indent=1)


def load_trainer_state(path: str) -> dict[str, Any]:
    """Inverse of :func:`save_trainer_state`."""
    with open(os.path.join(path, TRAINER_STATE)) as f:
        return json.load(f)
