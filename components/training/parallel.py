"""How a stage's model is laid out across workers and memory: the DDP or FSDP wrapper, activation
recomputation, gradient clipping across shards, and the whole (unsharded) model that validation and
checkpoints read. The loop (:mod:`components.training.loop`) calls these; none of them changes what
is learned, only where it is held.
"""

from __future__ import annotations

import contextlib
import copy
import resource
import sys
from typing import Any

import ray.train.torch
import torch

from components.training.spec import StageConfig


def fsdp_class() -> type:
    """FSDP's wrapper class, imported on first use: the import (DTensor's operator tables) costs
    about 0.6 s of CPU in every training worker, and only sharded runs need it."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel


def is_fsdp(model: torch.nn.Module) -> bool:
    """Whether ``model`` is FSDP-wrapped (never, while nothing has imported FSDP)."""
    return "torch.distributed.fsdp" in sys.modules and isinstance(model, fsdp_class())


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP or FSDP wrapper."""
    wrapped = isinstance(model, torch.nn.parallel.DistributedDataParallel) or is_fsdp(model)
    return model.module if wrapped else model


def full_parameters(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """Inside the block, the module in ``model`` holds its whole parameters: under FSDP they are
    gathered from every rank (a collective: every rank enters), so a task's own forward passes
    outside the training step (a refreshed tool or pool embedding) see weights, not empty shards.
    Anything else holds them already."""
    if not is_fsdp(model):
        return contextlib.nullcontext()
    return fsdp_class().summon_full_params(model, writeback=False)


def plain_name(name: str) -> str:
    """A parameter's or buffer's name as in the unwrapped module (FSDP's nested wrappers add a
    ``_fsdp_wrapped_module.`` prefix per level)."""
    return name.replace("_fsdp_wrapped_module.", "")


class WholeModel:
    """The whole, unsharded model for validation and checkpoints, whatever wraps the one training.

    Under DDP (or one worker) that is the module inside the wrapper. FSDP shards the parameters,
    so a CPU copy taken before wrapping is filled with the gathered full state each time it is
    asked for (a collective: every rank asks). Its tensors are its own, which safetensors and
    ``save_pretrained`` need (FSDP's unsharded views share one flat storage).
    """

    def __init__(self, model: torch.nn.Module, fsdp: bool) -> None:
        self.copy = copy.deepcopy(model).cpu() if fsdp else None

    def __call__(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.copy is None:
            return unwrap(model)
        with fsdp_class().summon_full_params(model, writeback=False):
            state = {k: v.detach().clone().cpu() for k, v in unwrap(model).state_dict().items()}
        self.copy.load_state_dict(state)
        return self.copy

    def keep_buffers(self, model: torch.nn.Module) -> None:
        """Carry the copy's buffers back into the training module: what the task's validation
        refreshed in the copy (MassTool's search pool and tool embeddings, re-embedded with the
        encoder as trained so far). FSDP shards parameters, not buffers, so every rank holds them
        whole. Without this the next call reloaded the training module's stale buffers into the
        copy: the checkpoint paired the new encoder with the old pool, and so did the next epoch."""
        if self.copy is None:
            return
        inner = {plain_name(n): b for n, b in unwrap(model).named_buffers()}
        with torch.no_grad():
            for name, buffer in self.copy.named_buffers():
                inner[name].copy_(buffer.to(inner[name].device))


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state as one process training the whole model holds it: every parameter's
    moments whole, parameters numbered in group order. Under FSDP each rank's optimizer holds only
    its shard, so the full state is gathered (a collective: every rank asks) and renumbered; a
    checkpoint then resumes on any number of workers, sharded or not."""
    if not is_fsdp(model):
        return optimizer.state_dict()
    full = fsdp_class().optim_state_dict(model, optimizer)  # keyed by parameter name
    index = {name: i for i, name in enumerate(n for g in full["param_groups"] for n in g["params"])}
    return {
        "state": {index[name]: values for name, values in full["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]],
    }


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load what :func:`optimizer_state` gave into ``optimizer``; under FSDP each rank keeps its
    shard of it (every rank must call)."""
    if not is_fsdp(model):
        optimizer.load_state_dict(state)
        return
    name_of = {id(p): plain_name(n) for n, p in unwrap(model).named_parameters()}
    names = [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]
    groups = [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]]
    full = {"state": {names[int(i)]: values for i, values in state["state"].items()}, "param_groups": groups}
    optimizer.load_state_dict(fsdp_class().optim_state_dict_to_load(model, optimizer, full))


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Turn on activation recomputation in every Hugging Face model inside ``model``."""
    backbones = [m for m in model.modules() if getattr(m, "supports_gradient_checkpointing", False)]
    if not backbones:
        raise ValueError(
            f"gradient_checkpointing: {type(model).__name__} holds no model that supports it "
            "(a Hugging Face PreTrainedModel with supports_gradient_checkpointing)"
        )
    for backbone in backbones:
        # Non-reentrant: works with inputs that need no grad (frozen embeddings) and with DDP.
        # Transformers 5.x renamed the switch (the old name warns, and goes in v6).
        if hasattr(backbone, "activation_checkpointing_enable"):
            backbone.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def sharded(config: StageConfig, world: int) -> bool:
    """Whether the stage's model is sharded with FSDP (only ever across several workers)."""
    return config.parallel_strategy == "fsdp" and world > 1


def prepare(model: torch.nn.Module, config: StageConfig, world: int) -> torch.nn.Module:
    """Move to the worker's device and wrap for ``config.parallel_strategy`` when there are several
    workers (Ray Train's ``prepare_model``). Ray Train offers FSDP on GPU workers only; on CPU
    workers (gloo) the same wrapper is built here, so the sharded path also runs, and is tested, on
    a CPU cluster."""
    if sharded(config, world) and config.device == "cpu":
        return fsdp_wrap(ray.train.torch.prepare_model(model, parallel_strategy=None))
    kwargs = FSDP_OPTIONS if config.parallel_strategy == "fsdp" else None
    return ray.train.torch.prepare_model(
        model, parallel_strategy=config.parallel_strategy, parallel_strategy_kwargs=kwargs
    )


# FSDP keeps the module's own parameters visible (as views into its flat shards): a task's
# parameter groups find them by submodule (MassTool's encoder at encoder_lr), and frozen and
# trainable parameters may share a wrapper. Without it FSDP moves every parameter into the root's
# flat parameter, so the encoder's group came out empty and the encoder trained at lr.
FSDP_OPTIONS = {"use_orig_params": True}


def fsdp_wrap(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in FSDP on CPU workers (gloo), as Ray Train wraps it on GPU workers."""
    return fsdp_class()(model, device_id=torch.device("cpu"), **FSDP_OPTIONS)


def clip_gradients(model: torch.nn.Module, max_norm: float) -> None:
    """Clip the global gradient norm (FSDP computes it across its shards)."""
    if is_fsdp(model):
        model.clip_grad_norm_(max_norm)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def mean_across_workers(total: float, count: int) -> float:
    """``total / count`` summed over every worker: the epoch's mean training loss over all the
    workers' batches, where each worker alone knows only its own shard's. Every rank must call it
    (an all-reduce) when a process group is up; otherwise it is the plain mean."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return total / count
    # NCCL reduces CUDA tensors only; gloo reduces CPU ones.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    sums = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
    dist.all_reduce(sums)
    return (sums[0] / sums[1]).item()


def peak_memory_mb(device: str) -> float:
    """Peak memory of this worker so far, in MiB: allocated GPU memory on CUDA (what the model,
    activations and optimizer state took), the process's peak resident set on CPU."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
