"""The data contract: loading, validation, splits and graphs (see ``loader`` for the layout)."""

from __future__ import annotations

from typing import Any

from components.data.loader import load_dataset
from components.data.prepared import is_prepared, load_prepared
from components.data.rejects import DatasetError, RejectLog
from components.data.splits import splits_from_config
from components.data.types import Corpus, Dataset, Qrels, Queries, Results

__all__ = [
    "Corpus",
    "Dataset",
    "DatasetError",
    "Qrels",
    "Queries",
    "RejectLog",
    "Results",
    "dataset_from_config",
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
    return splits_from_config(dataset, splits)


def dataset_from_config(cfg: dict[str, Any]) -> Dataset:
    """:func:`open_dataset` for a full config (``data.path``, ``data.storage_options``, ``splits``)."""
    data = cfg["data"]
    return open_dataset(data["path"], cfg.get("splits"), storage_options=data.get("storage_options"))
