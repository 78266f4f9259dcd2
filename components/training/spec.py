"""What the driver hands to training: where a run lives (:class:`RunSpec`) and what one stage
trains (:class:`StageConfig`).

Both are typed and :class:`StageConfig` is frozen: a worker receives exactly what the driver
built, never a loose dict that a method, a test or a retry could extend on the way. The worker
builds the stage's task from ``StageConfig.task``, an import string, so this package never
imports a method: any package that provides a :class:`components.training.task.StageTask` can
train here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from typing import Any, Protocol


@dataclass
class RunSpec:
    """Where and how a training stage runs (filled from the ``train`` section of a config)."""

    name: str = "toolscout"
    storage_path: str = "runs"
    # 0 is Ray Train's local mode: the stage runs in this process, no worker actors (debugging,
    # small stages, tests); the loop then persists each epoch's checkpoint to storage itself.
    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] = field(default_factory=dict)
    max_failures: int = 0
    keep_checkpoints: int | None = None  # None keeps every epoch's checkpoint
    local_dir: str = "runs/checkpoints"  # where checkpoints from remote storage are downloaded
    env: dict[str, str] = field(default_factory=dict)  # environment variables for the workers
    storage_options: dict[str, Any] = field(default_factory=dict)  # fsspec options for s3:// storage
    seed: int = 0
    # torch.use_deterministic_algorithms in the workers: on CPU, the backward of indexing with
    # repeated indices (index_put with accumulate) adds in thread order otherwise, so two runs of
    # one config differed in the 6th digit of every weight.
    deterministic: bool = True
    precision: str = "fp32"  # "fp32" | "bf16" (autocast in the forward and loss)
    # Optimizer step every N batches (the loss of each is divided by N): an effective batch N times
    # the one that fits in memory.
    grad_accumulation: int = 1
    # Recompute activations in the backward pass instead of keeping them (the Hugging Face models'
    # gradient_checkpointing_enable): less memory, about a third more compute.
    gradient_checkpointing: bool = False
    # How several workers share the model: "ddp" (a replica each) or "fsdp" (parameters, gradients
    # and optimizer state sharded, for models that do not fit one GPU), through Ray Train's prepare_model.
    parallel_strategy: str = "ddp"
    # Inside a Ray Tune trial: the key its scheduler stops trials on (``valid_ndcg@3``). Every
    # epoch's report also goes to Tune (Ray Train's TuneReportCallback); one without the key fails
    # the trial, naming the keys the stage does report. None: epochs are not reported to Tune.
    report_to_tune: str | None = None


@dataclass(frozen=True)
class StageInputs:
    """What a stage reads besides its settings.

    Attributes:
        dataset: The :class:`components.data.types.Dataset`, or a Ray object reference to it (the
            driver puts it in the object store once; every worker gets it from there).
        init_dir: The model the stage starts from (a directory every worker can read: see
            :func:`components.training.inputs.share`), or ``None`` when the task builds it.
    """

    dataset: Any
    init_dir: str | None = None


@dataclass(frozen=True)
class Chaos:
    """A planned failure for fault-tolerance tests and drills: the worker process exits once at
    ``kill_at_epoch``, leaving ``marker`` behind so that the retry runs on."""

    kill_at_epoch: int
    marker: str


PRECISIONS = ("fp32", "bf16")
PARALLEL_STRATEGIES = ("ddp", "fsdp")


class TrainParams(Protocol):
    """The optimisation settings most methods' params dataclasses carry (see
    :meth:`StageConfig.from_params`)."""

    epochs: int
    lr: float
    batch_size: int
    weight_decay: float
    select_metric: str
    progress: bool


@dataclass(frozen=True)
class StageConfig:
    """One training stage, as the driver hands it to every Ray Train worker.

    Attributes:
        task: Import string ``"package.module:Class"`` of the stage's task; the class is called
            with this config.
        stage: The stage's name (it names the Ray Train run: ``<run name>-<stage>``).
        params: The method's own typed settings (a dataclass), read by the task.
        inputs: The dataset and the starting model.
        epochs / lr / batch_size / weight_decay / max_grad_norm: The optimisation (AdamW; the
            global batch is ``batch_size`` split over the workers).
        warmup_steps: Linear learning-rate warm-up over the first optimizer steps (0: none).
        score: Reported metric that ranks checkpoints (higher is better).
        precision: ``fp32``, or ``bf16`` autocast.
        device: ``cpu`` or ``cuda``; filled from the run by :meth:`for_run`.
        seed / deterministic: Seeded, deterministic kernels (equal configs train to equal weights).
        run_name / storage_path / storage_options: Checkpoint and resume settings, filled from the
            run by :meth:`for_run`: the same name and storage resume the run.
        progress / report_log / chaos: A progress bar, a JSON-lines log of each reported epoch
            (to audit resumes) and a planned failure; none of them changes what is trained.
        local: Ray Train's local mode (``num_workers: 0``), filled by :meth:`for_run`.
    """

    task: str
    stage: str
    params: Any
    inputs: StageInputs
    epochs: int
    lr: float
    batch_size: int
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    score: str = "valid_ndcg@3"
    precision: str = "fp32"
    grad_accumulation: int = 1
    gradient_checkpointing: bool = False
    parallel_strategy: str = "ddp"
    device: str = "cpu"
    seed: int = 0
    deterministic: bool = True
    run_name: str = ""
    storage_path: str = ""
    storage_options: dict[str, Any] = field(default_factory=dict)
    progress: bool = False
    report_log: str | None = None
    chaos: Chaos | None = None
    local: bool = False

    def __post_init__(self) -> None:
        if ":" not in self.task:
            raise ValueError(f"StageConfig.task {self.task!r}: expected an import string 'module:Class'")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: expected one of {PRECISIONS}")
        if self.parallel_strategy not in PARALLEL_STRATEGIES:
            raise ValueError(
                f"parallel_strategy {self.parallel_strategy!r}: expected one of {PARALLEL_STRATEGIES}"
            )
        if int(self.grad_accumulation) < 1:
            raise ValueError(f"grad_accumulation must be >= 1, got {self.grad_accumulation}")
        if int(self.epochs) < 1 or int(self.batch_size) < 1 or float(self.lr) <= 0:
            raise ValueError(
                f"stage {self.stage!r}: epochs and batch_size must be >= 1 and lr > 0 "
                f"(got {self.epochs}, {self.batch_size}, {self.lr})"
            )

    @classmethod
    def from_params(cls, task: str, stage: str, params: TrainParams, inputs: StageInputs) -> StageConfig:
        """A stage whose epochs, learning rate, batch size, weight decay and progress bar come from
        the method's params, checkpoints ranked by ``valid_<params.select_metric>``."""
        return cls(
            task=task,
            stage=stage,
            params=params,
            inputs=inputs,
            epochs=params.epochs,
            lr=params.lr,
            batch_size=params.batch_size,
            weight_decay=params.weight_decay,
            score=f"valid_{params.select_metric}",
            progress=params.progress,
        )

    def for_run(self, run: RunSpec) -> StageConfig:
        """This stage inside ``run``: its run name, storage, seed, device, precision and memory settings."""
        return replace(
            self,
            run_name=f"{run.name}-{self.stage}",
            storage_path=run.storage_path,
            storage_options=dict(run.storage_options),
            seed=run.seed,
            deterministic=run.deterministic,
            device="cuda" if run.use_gpu else "cpu",
            precision=run.precision if self.precision == "fp32" else self.precision,
            grad_accumulation=run.grad_accumulation,
            gradient_checkpointing=run.gradient_checkpointing,
            parallel_strategy=run.parallel_strategy,
            local=run.num_workers == 0,
        )


def pack(config: StageConfig) -> dict[str, Any]:
    """Ray Train's ``train_loop_config`` for ``config``: the config, its method params in Ray's
    object store (as the dataset is), by reference.

    Ray Train's controller (a process of its own per run, started before any worker) receives the
    config and only passes it on. Holding the params themselves, it would import their method's
    package, model code, torch and transformers included: ~2 s on 2 cores, on the path to the
    first epoch of every run. A reference imports nothing; :func:`unpack` fetches the params in
    the worker, which needs them."""
    import ray

    return {"stage": replace(config, params=None), "params": ray.put(config.params)}


def unpack(loop_config: dict[str, Any]) -> StageConfig:
    """The :class:`StageConfig` that :func:`pack` packed."""
    import ray

    return replace(loop_config["stage"], params=ray.get(loop_config["params"]))


def import_object(path: str) -> Any:
    """The object an import string ``"package.module:Name"`` names, with a clear error."""
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"cannot import {path!r}: {e}") from e
