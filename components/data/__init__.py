"""The data contract: loading, validation, splits and graphs (see ``loader`` for the layout)."""

from __future__ import annotations

from typing import Any

from components.data.loader import load_dataset
from components.data.prepared import is_prepared, load_prepared
from components.data.rejects import DatasetError, RejectLog
from components.data.splits import prepare_splits
from components.data.types import Corpus, Dataset, Qrels, Queries, Results

__all__ = [
    "Corpus",
    "Dataset",
    "DatasetError",
    "Qrels",
    "Queries",
    "RejectLog",
    "Results",
    "open_dataset",
]


def open_dataset(
    path: str,
    splits: dict[str, Any] | None = None,
    *,
    strict: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """A dataset with train / valid / test splits from a prepared directory or a raw BEIR one.

    A prepared directory (output of ``toolscout preprocess``) is read as written; a raw directory
    is loaded and split in this process with the ``splits`` settings (mode, fractions, seed).
    """
    if is_prepared(path, storage_options):
        return load_prepared(path, storage_options)
    log = RejectLog()
    dataset = load_dataset(path, strict=strict, log=log, storage_options=storage_options)
    if len(log):
        print(f"warning: {len(log)} row(s) rejected while loading {path}: {log.counts()}")
    s = splits or {}
    return prepare_splits(
        dataset,
        mode=s.get("mode", "standard"),
        valid_fraction=float(s.get("valid_fraction", 0.1)),
        unseen_fraction=float(s.get("unseen_fraction", 0.1)),
        seed=int(s.get("seed", 0)),
    )
