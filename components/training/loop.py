"""The one training loop every method stage runs in, inside Ray Train workers (or, in Ray Train's
local mode, ``train.num_workers: 0``, in the driver's process).

Per epoch: shuffle (seeded by epoch, so a resumed run sees the same order), train, validate,
then report the metrics and a checkpoint (model weights, optimizer and RNG state in safetensors,
trainer state in JSON). On start it resumes from ``ray.train.get_checkpoint()`` when Ray hands
one over (a retry after a worker failure, or a restarted run with the same name and storage).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray.train
import ray.train.torch
import torch
from safetensors.torch import load_model, save_model
from torch.utils.data import DataLoader
from tqdm import tqdm

from components.training.batches import EvenBatches
from components.training.checkpoints import MODEL_STATE, STAGE_OUTPUT, file_sizes, persist
from components.training.parallel import (
    WholeModel,
    clip_gradients,
    enable_gradient_checkpointing,
    full_parameters,
    load_optimizer_state,
    mean_across_workers,
    optimizer_state,
    peak_memory_mb,
    prepare,
    sharded,
    unwrap,
)
from components.training.resume import resume_checkpoint, settings_fingerprint, settings_values
from components.training.spec import StageConfig, import_object, unpack
from components.training.state import (
    load_rng_state,
    load_trainer_state,
    read_optimizer,
    rng_state,
    save_rng_state,
    save_trainer_state,
    write_optimizer,
)
from components.training.task import StageTask


def make_task(config: StageConfig) -> StageTask:
    """Build the stage's task from its import string (in the worker)."""
    task = import_object(config.task)(config)
    if not isinstance(task, StageTask):
        raise TypeError(f"{config.task} built a {type(task).__name__}, not a StageTask")
    return task


def _chaos(config: StageConfig, epoch: int) -> None:
    """Kill this worker process once at a chosen epoch (fault-tolerance tests and drills)."""
    chaos = config.chaos
    if chaos is not None and chaos.kill_at_epoch == epoch and not os.path.exists(chaos.marker):
        with open(chaos.marker, "w") as f:
            f.write(str(os.getpid()))
        os._exit(1)


def _log_report(config: StageConfig, record: dict[str, Any]) -> None:
    """Append a reported epoch to ``config.report_log`` (rank 0), to audit resumes."""
    if config.report_log:
        with open(config.report_log, "a") as f:
            f.write(json.dumps(record) + "\n")


def save_checkpoint(
    path: str,
    model: torch.nn.Module,
    optimizer_state: dict[str, Any],
    task: StageTask,
    epoch: int,
    history: list[dict],
    settings: str | None = None,
    values: Any = None,
    rng_states: list[dict[str, torch.Tensor]] | None = None,
) -> None:
    save_model(model, os.path.join(path, MODEL_STATE))
    write_optimizer(optimizer_state, path)
    save_rng_state(path, rng_states)  # every rank's (gathered by the caller), or this process's
    task.save_model(model, os.path.join(path, STAGE_OUTPUT))
    # Last, listing every file above: an upload cut short (Ray copies the files in no set order)
    # that lost a whole file, the model's weights or the RNG state, is then not taken as complete.
    save_trainer_state(path, epoch, history, settings, file_sizes(path), values)


def all_rng_states(world: int) -> list[dict[str, torch.Tensor]]:
    """Every rank's generator states, in rank order (on every rank)."""
    if world == 1:
        return [rng_state()]
    gathered: list[Any] = [None] * world
    torch.distributed.all_gather_object(gathered, rng_state())
    return gathered


def build_model(task: StageTask, config: StageConfig) -> torch.nn.Module:
    """The task's model, with activation recomputation switched on when the stage asks for it."""
    model = task.build_model()
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def build_optimizer(model: torch.nn.Module, config: StageConfig, task: StageTask) -> torch.optim.Optimizer:
    """AdamW with the stage's learning rate and weight decay over the task's parameter groups."""
    return torch.optim.AdamW(
        task.param_groups(model), lr=float(config.lr), weight_decay=float(config.weight_decay)
    )


def make_loader(
    task: StageTask, config: StageConfig, world: int, generator: torch.Generator, rank: int = 0
) -> DataLoader:
    """Shuffled batches of at most ``batch_size // world`` per worker (the global batch is
    ``batch_size`` when the worker count divides it), as even as :class:`EvenBatches` makes them.

    With several workers each gets its own shard from a ``DistributedSampler`` seeded with the
    run's seed (Ray's ``prepare_data_loader`` would add one seeded 0, ignoring ``seed``). No
    example is dropped: a one-epoch stage (a query-generation alignment round) never saw the up
    to ``batch_size - 1`` examples that ``drop_last`` left out. The sampler instead repeats up to
    ``world - 1`` examples an epoch, so that every worker takes the same number of steps (DDP's
    all-reduce and FSDP's gathers wait for every rank at every step); one worker sees each once.
    """
    data = task.train_data()
    if len(data) == 0:
        raise ValueError(f"{config.stage}: no training examples; add training data")
    if world > 1:
        order: torch.utils.data.Sampler[int] = torch.utils.data.DistributedSampler(
            data, num_replicas=world, rank=rank, shuffle=True, seed=int(config.seed)
        )
    else:
        order = torch.utils.data.RandomSampler(data, generator=generator)
    batches = EvenBatches(order, max(1, int(config.batch_size) // world))
    return DataLoader(data, batch_sampler=batches, collate_fn=task.collate)


def run_epoch(
    task: StageTask,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Any,
    config: StageConfig,
    epoch: int,
    show_bar: bool,
    whole: Callable[[torch.nn.Module], torch.nn.Module] = unwrap,
) -> dict[str, float]:
    """Train one epoch, then validate the model ``whole`` gives (the unwrapped module, or FSDP's
    gathered copy: :class:`WholeModel`); returns the epoch's metrics (``valid_*``, loss, seconds)."""
    started = time.perf_counter()
    with full_parameters(model):  # every rank: gathering FSDP's shards is a collective
        task.start_epoch(unwrap(model), epoch)  # e.g. refresh embeddings the task caches (MassTool's pool)
    model.train()
    losses = []
    accumulate = int(config.grad_accumulation)
    steps_per_epoch = -(-len(loader) // accumulate)
    optimizer.zero_grad(set_to_none=True)
    for step, batch in enumerate(tqdm(loader, desc=f"{config.stage} epoch {epoch}", disable=not show_bar)):
        # The optimizer steps after every ``accumulate`` batches and after the epoch's last one.
        last = (step + 1) % accumulate == 0 or step + 1 == len(loader)
        # Each batch's share of its step: the epoch's last group may hold fewer than ``accumulate``
        # batches, and dividing those by ``accumulate`` would shrink that step's gradient.
        group = min(accumulate, len(loader) - step // accumulate * accumulate)
        warm_up(optimizer, epoch * steps_per_epoch + step // accumulate, config)
        # DDP would all-reduce gradients after every backward; between steps that is wasted.
        sync = model.no_sync() if not last and hasattr(model, "no_sync") else contextlib.nullcontext()
        with sync:
            with autocast(config):
                loss = task.loss(model, batch)
            (loss / group).backward()
        if last:
            clip_gradients(model, float(config.max_grad_norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    if not losses:
        # No training example at all: a silent no-op epoch would report loss 0.
        raise ValueError(f"{config.stage}: no training examples in this epoch; add training data")
    model.eval()
    metrics = {f"valid_{k}": float(v) for k, v in task.validate(whole(model)).items()}
    return metrics | {
        "epoch": epoch,
        "train_loss": mean_across_workers(sum(losses), len(losses)),  # every worker's batches
        "epoch_seconds": time.perf_counter() - started,
        "peak_memory_mb": peak_memory_mb(config.device),
    }


def warm_up(optimizer: torch.optim.Optimizer, step: int, config: StageConfig) -> None:
    """Linear warm-up: each group's learning rate is its configured one times ``(step + 1) / warmup``
    until ``warmup_steps``; computed from the step, so a resumed run continues the same schedule."""
    if config.warmup_steps <= 0:
        return
    factor = min(1.0, (step + 1) / config.warmup_steps)
    for group in optimizer.param_groups:
        group.setdefault("base_lr", group["lr"])
        group["lr"] = group["base_lr"] * factor


def autocast(config: StageConfig) -> contextlib.AbstractContextManager:
    """bf16 autocast for ``precision: bf16`` (weights and optimizer state stay fp32), else nothing."""
    if config.precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=config.device, dtype=torch.bfloat16)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: build the task from the stage's ``task`` and train it epoch by epoch
    (Ray Train passes a dict: the one :class:`StageConfig`, packed by :func:`spec.pack`)."""
    config = unpack(loop_config)
    # Restored afterwards: in Ray Train's local mode this runs in the driver's process.
    with deterministic_kernels(bool(config.deterministic)):
        _train(config)


@contextlib.contextmanager
def deterministic_kernels(enabled: bool) -> Iterator[None]:
    """``torch.use_deterministic_algorithms`` inside the block (warn-only: an op without a
    deterministic kernel warns instead of failing), restored after it."""
    previous = torch.are_deterministic_algorithms_enabled()
    previous_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=previous_warn)


def _train(config: StageConfig) -> None:
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(int(config.seed))
    task = make_task(config)
    model = build_model(task, config)
    fsdp = sharded(config, world)
    # FSDP flattens and shards the parameters when it wraps the model, so its optimizer must be
    # built on the wrapped model; DDP keeps the same parameters, built before (as ever).
    optimizer = None if fsdp else build_optimizer(model, config, task)
    whole = WholeModel(model, fsdp)
    settings, values = settings_fingerprint(config), settings_values(config)
    start, history = 0, []
    checkpoint = resume_checkpoint(config)
    opened = checkpoint.as_directory() if checkpoint is not None else contextlib.nullcontext()
    with opened as path:
        if path is not None:
            # run_stage checked this checkpoint's settings on the driver before starting workers.
            state = load_trainer_state(path)
            load_model(model, os.path.join(path, MODEL_STATE))
            start, history = state["epoch"] + 1, state["history"]
        # Move to the worker's device (and wrap in DDP) first: the optimizer's load_state_dict
        # then casts its saved state to the device of the parameters it belongs to.
        model = prepare(model, config, world)
        if optimizer is None:
            optimizer = build_optimizer(model, config, task)
        if path is not None:
            # The whole optimizer state (see optimizer_state): under FSDP each rank keeps its shard.
            load_optimizer_state(model, optimizer, read_optimizer(path))
            load_rng_state(path, rank)
    generator = torch.Generator()
    loader = ray.train.torch.prepare_data_loader(
        make_loader(task, config, world, generator, rank), add_dist_sampler=False
    )
    for epoch in range(start, int(config.epochs)):
        generator.manual_seed(int(config.seed) * 1000 + epoch)
        if world > 1:
            loader.batch_sampler.set_epoch(epoch)
        _chaos(config, epoch)
        metrics = run_epoch(
            task, model, optimizer, loader, config, epoch, rank == 0 and bool(config.progress), whole
        )
        whole.keep_buffers(model)  # what validation refreshed stays in the model trained and saved
        history.append(metrics)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            saved = whole(model)  # every rank: gathering FSDP's shards is a collective
            moments = optimizer_state(model, optimizer)  # a collective too, under FSDP
            rngs = all_rng_states(world)  # a collective with several workers
            if rank == 0:
                save_checkpoint(tmp, saved, moments, task, epoch, history, settings, values, rngs)
                ckpt = ray.train.Checkpoint.from_directory(tmp)
                _log_report(config, {"epoch": epoch, "pid": os.getpid(), **metrics})
                if config.local:
                    # Local mode keeps only the last report, in memory: persist each as Ray would.
                    persist(tmp, config.storage_path, config.run_name, epoch, config.storage_options)
            ray.train.report(metrics, checkpoint=ckpt)
