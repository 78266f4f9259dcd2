"""The data contract: loading, validation, splits and graphs (see ``loader`` for the layout)."""

from __future__ import annotations

import sys
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
    name: str | None = None,
    files: list[str] | None = None,
) -> Dataset:
    """A dataset with train / valid / test splits from a prepared directory or a raw BEIR one.

    A prepared directory (output of ``toolscout preprocess``) is read as written; a raw directory
    is loaded and split in this process with the ``splits`` settings (mode, fractions, seed).
    ``strict``, ``name`` and ``files`` (the qrels splits to read) apply to raw directories; a
    prepared one was checked when it was written.
    """
    if is_prepared(path, storage_options):
        return load_prepared(path, storage_options)
    log = RejectLog()
    dataset = load_dataset(path, files, strict=strict, log=log, storage_options=storage_options, name=name)
    if len(log):
        # stderr: commands such as ``evaluate`` print their report on stdout.
        print(f"warning: {len(log)} row(s) rejected while loading {path}: {log.counts()}", file=sys.stderr)
    return splits_from_config(dataset, splits)


def dataset_from_config(cfg: dict[str, Any]) -> Dataset:
    """:func:`open_dataset` for a full config (the ``data`` section and ``splits``)."""
    data = cfg["data"]
    return open_dataset(
        data["path"],
        cfg.get("splits"),
        strict=bool(data.get("strict", False)),
        storage_options=data.get("storage_options"),
        name=data.get("name"),
        files=data.get("splits"),
    )
