"""The data contract: loading, validation, splits and graphs (see ``loader`` for the layout)."""

from __future__ import annotations

import sys
from typing import Any

from components.data import io
from components.data.loader import load_dataset, split_names
from components.data.prepared import is_prepared, load_prepared, read_manifest
from components.data.rejects import DatasetError, RejectLog
from components.data.splits import split_settings, splits_from_config
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
    ``name`` applies to raw directories; a prepared one was checked when it was written, and must
    have read the qrels ``files`` named (when named). ``strict`` refuses a prepared directory
    whose preparation rejected rows, as it refuses a raw one that has them.
    """
    if is_prepared(path, storage_options):
        manifest = read_manifest(path, storage_options)
        rejected = int((manifest.get("rejects") or {}).get("total", 0))
        if strict and rejected:
            # Before, a strict run on such a preparation went ahead without a word: the rows
            # dropped when it was written are not in it.
            raise DatasetError(
                f"{path}: data.strict is set, and preparing it rejected {rejected} row(s) "
                f"(see {io.join(path, 'rejects.jsonl')})"
            )
        check_prepared_splits(path, manifest, splits)
        check_prepared_files(path, manifest, files)
        return load_prepared(path, storage_options, manifest)
    log = RejectLog()
    dataset = load_dataset(path, files, strict=strict, log=log, storage_options=storage_options, name=name)
    if len(log):
        # stderr: commands such as ``evaluate`` print their report on stdout.
        print(log.summary(path), file=sys.stderr)
    return splits_from_config(dataset, splits)


def check_prepared_splits(path: str, manifest: dict[str, Any], splits: dict[str, Any] | None) -> None:
    """A prepared directory holds the splits it was written with: a run that asks for others
    (``splits.mode=cold_start`` on a standard preparation) would get those, labelled as asked.

    Raises:
        DatasetError: the run's ``splits`` settings differ from the preparation's.
    """
    written = split_settings((manifest.get("config") or {}).get("splits"))
    asked = split_settings(splits)
    if asked != written:
        raise DatasetError(
            f"{path}: prepared with splits {written}, but this run asks for {asked}; "
            "run `toolscout preprocess` with these splits, or drop the overrides"
        )


def check_prepared_files(path: str, manifest: dict[str, Any], files: str | list[str] | None) -> None:
    """A run that names its qrels files (``data.splits``) gets a preparation of those files: which
    were read decides whether valid is shipped or carved and which train queries another split's
    judgement removes, so another preparation would train on another set, labelled as asked.

    Raises:
        DatasetError: the preparation read other qrels files than ``files`` names.
    """
    if files is None:
        return
    read = sorted(rel for rel in manifest.get("inputs") or {} if rel.startswith("qrels/"))
    asked = sorted(f"qrels/{split}.tsv" for split in split_names(files))
    if read != asked:
        raise DatasetError(
            f"{path}: prepared from {read}, but this run asks for {asked} (data.splits); run "
            "`toolscout preprocess` with these splits, or drop the override"
        )


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
