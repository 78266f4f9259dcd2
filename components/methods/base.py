"""The method protocol every retrieval method implements, and the specs passed to training.

A method is a plug-in with named training stages. ``toolscout train`` runs the stages in order
(each one a Ray Train run for trainable methods), then ``index`` embeds or indexes the corpus,
and ``retrieve`` answers queries. Artifacts are ``config.json`` plus safetensors / ``.npy``,
never pickle, so they load in any process and across versions.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from components.data.types import Corpus, Dataset, Queries, Results


@dataclass
class RunSpec:
    """Where and how a training stage runs (filled from the ``train`` section of a config)."""

    name: str = "toolscout"
    storage_path: str = "runs"
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


@runtime_checkable
class Method(Protocol):
    """A tool-retrieval method.

    A method with stages also has a classmethod ``stage_task(stage, config)`` returning the
    worker-side :class:`components.training.task.StageTask` that the Ray Train loop runs.

    Attributes:
        name: Registry key.
        stages: Training stages in order; empty for methods that only index (BM25).
    """

    name: ClassVar[str]
    stages: ClassVar[tuple[str, ...]]

    def fit(self, stage: str, data: Dataset, run: RunSpec) -> dict[str, float]:
        """Run one training stage; returns the validation metrics of its best checkpoint."""
        ...

    def index(self, corpus: Corpus) -> None:
        """Build the search structure over the tool corpus."""
        ...

    def retrieve(self, queries: Queries, k: int) -> Results:
        """Top-``k`` tools with scores for each query."""
        ...

    def save(self, path: str) -> None:
        """Write ``config.json`` and array files to the directory ``path``."""
        ...

    @classmethod
    def load(cls, path: str) -> Method:
        """Rebuild a method saved with :meth:`save`."""
        ...


def write_config(path: str, config: dict[str, Any]) -> None:
    """Write a method's ``config.json`` (the method name included, for the registry)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def read_config(path: str) -> dict[str, Any]:
    """Read ``config.json`` from an artifact directory, with a clear error if it is not one."""
    file = os.path.join(path, "config.json")
    if not os.path.exists(file):
        raise FileNotFoundError(f"{path}: not a toolscout artifact directory (no config.json)")
    with open(file) as f:
        return json.load(f)
