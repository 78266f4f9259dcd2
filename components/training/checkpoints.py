"""Find a run's persisted checkpoints in its storage (local or s3://), independent of Ray's records.

Ray Train registers a checkpoint when its controller next polls the worker that reported it. A
worker that dies right after ``ray.train.report`` leaves its checkpoint uploaded but unregistered,
so ``ray.train.get_checkpoint()`` hands back the one before, and that epoch would run twice. The
loop and the runner therefore also look at what is actually in storage, trusting a checkpoint
only when every file the loop writes is present, its model directory is not empty, and every
file the trainer state lists is stored at the size it was written with (a worker killed
mid-upload can leave any file short or missing, and Ray uploads them in no set order); for a
checkpoint written before that list, every JSON file must parse and every safetensors file hold
all the bytes its header promises. A checkpoint that fails is passed over, so a resume falls back
to the newest complete one.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable
from typing import Any

from components.data import io
from components.training.state import OPTIMIZER_META, OPTIMIZER_TENSORS, TRAINER_STATE

MODEL_STATE = "model_state.safetensors"
STAGE_OUTPUT = "model"  # sub-directory of each checkpoint holding the task's reloadable model
REQUIRED = (MODEL_STATE, OPTIMIZER_META, OPTIMIZER_TENSORS, TRAINER_STATE, STAGE_OUTPUT)


def file_sizes(directory: str) -> dict[str, int]:
    """Size of every file under a local checkpoint ``directory``, by its path relative to it."""
    return {
        os.path.relpath(os.path.join(root, name), directory): os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(directory)
        for name in names
    }


def run_dir(storage_path: str, run_name: str) -> str:
    """Where Ray Train keeps a run's checkpoints."""
    return io.join(storage_path, run_name)


def persisted(
    storage_path: str, run_name: str, storage_options: dict | None = None
) -> list[tuple[str, dict]]:
    """``(checkpoint dir, trainer state)`` of every complete checkpoint of a run, oldest epoch first."""
    root = run_dir(storage_path, run_name)
    fs = io.filesystem(root, storage_options)
    # fsspec's filesystems are shared per process and s3fs keeps listings without expiry: the
    # workers' checkpoints of this run, written from other processes since the last look (a
    # resume lists the run before fit), would be missing from a cached listing.
    fs.invalidate_cache(root)
    if not fs.exists(root):
        return []
    # One listing of every file of the run (on S3 one paginated prefix listing, not three
    # requests per checkpoint), grouped by checkpoint directory.
    base = fs._strip_protocol(root).rstrip("/")
    files: dict[str, dict[str, Any]] = {}
    for file, info in _files(fs, base).items():
        top = file[len(base) + 1 :].split("/", 1)[0]
        if file.startswith(f"{base}/") and top.startswith("checkpoint_"):
            files.setdefault(f"{base}/{top}", {})[file] = info
    found = []
    for path, stored in files.items():
        # The names directly under the checkpoint; the model directory counts once it holds a file.
        names = {file[len(path) + 1 :].split("/", 1)[0] for file in stored}
        if not set(REQUIRED) <= names:
            continue
        try:
            with fs.open(f"{path}/{TRAINER_STATE}") as f:
                state = json.load(f)
            # The sizes the trainer state lists settle it; a checkpoint written before it listed
            # them has each file's own framing read instead.
            if "files" in state:
                whole = _all_listed(path, stored, state["files"])
            else:
                whole = all(_complete(fs, file, info["size"]) for file, info in stored.items())
        except (OSError, ValueError):  # truncated or unreadable: not a checkpoint to trust
            continue
        if not whole or not {"epoch", "history"} <= set(state):
            continue
        found.append(
            (path if not io.is_remote(storage_path) else f"{storage_path.split('://')[0]}://{path}", state)
        )
    return sorted(found, key=lambda item: item[1]["epoch"])


def _files(fs: Any, base: str, depth: int = 3) -> dict[str, Any]:
    """Every file under ``base`` with its details, through symlinked directories.

    fsspec's local ``find`` lists a symlinked directory as one entry of its own (``islink``) and
    does not descend, so a checkpoint linked into the run (a run assembled from another one's
    checkpoints) was passed over as incomplete. ``depth`` bounds how many links deep it follows,
    so a link cycle ends."""
    out: dict[str, Any] = {}
    for file, info in fs.find(base, detail=True).items():
        if info.get("islink") and depth > 0 and fs.isdir(file):
            out.update(_files(fs, file, depth - 1))
        else:
            out[file] = info
    return out


def _all_listed(path: str, stored: dict[str, Any], listed: dict[str, int]) -> bool:
    """Whether every file the trainer state lists is stored, at the size it was written with.

    A checkpoint's files reach storage in no set order, so one cut short can lack whole files
    (the weights under ``model/``, the RNG state) or hold some of them short."""
    root = path.rstrip("/")
    sizes = {name[len(root) + 1 :]: info.get("size") for name, info in stored.items()}
    return all(sizes.get(name.replace(os.sep, "/")) == size for name, size in listed.items())


def _complete(fs: Any, path: str, size: int) -> bool:
    """Whether one checkpoint file is whole: JSON that parses, or safetensors whose size is its
    header's length plus the end of its last tensor (the format's own framing). Other files pass."""
    if path.endswith(".json"):
        with fs.open(path) as f:
            json.load(f)
        return True
    if not path.endswith(".safetensors"):
        return True
    with fs.open(path) as f:
        head = f.read(8)
        if len(head) < 8:
            return False
        (length,) = struct.unpack("<Q", head)
        if 8 + length > size:
            return False
        header = json.loads(f.read(length))
    try:
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (KeyError, TypeError, IndexError):  # not a safetensors header
        return False
    return size == 8 + length + max(ends, default=0)


def latest(storage_path: str, run_name: str, storage_options: dict | None = None) -> tuple[str, dict] | None:
    """The persisted checkpoint with the highest epoch, or None."""
    found = persisted(storage_path, run_name, storage_options)
    return found[-1] if found else None


def _rank(score: str) -> Callable[[tuple[str, dict]], tuple[bool, float, int]]:
    """Sort key of a :func:`persisted` checkpoint: its own epoch's ``score``, NaN below every number
    (as Ray ranks it; compared as is, a NaN epoch could win and the real best be pruned), the
    earlier epoch on a tie."""

    def key(item: tuple[str, dict]) -> tuple[bool, float, int]:
        value = float(item[1]["history"][-1][score])
        return (not math.isnan(value), value if not math.isnan(value) else 0.0, -item[1]["epoch"])

    return key


def best_of(found: list[tuple[str, dict]], score: str) -> tuple[str, dict]:
    """Of :func:`persisted` checkpoints, the one whose own epoch scored highest on ``score``."""
    if not found:
        raise FileNotFoundError(
            "no complete checkpoint found for this run (on a cluster, storage_path must be storage "
            "every node reaches: a node-local path leaves each worker's checkpoints on its own disk)"
        )
    return max(found, key=_rank(score))


def persist(
    directory: str, storage_path: str, run_name: str, epoch: int, storage_options: dict | None = None
) -> str:
    """Copy a checkpoint the loop wrote into the run's storage, as Ray Train's controller would.

    For Ray Train's local mode, which keeps only the last reported checkpoint, in memory. The
    trainer state goes last: :func:`persisted` trusts no checkpoint whose state is missing, so a
    copy cut short is never resumed from.
    """
    target = io.join(run_dir(storage_path, run_name), f"checkpoint_local_epoch{epoch:06d}")
    io.remove(target, storage_options)  # a partial copy of this epoch from an interrupted run
    fs = io.filesystem(target, storage_options)
    fs.makedirs(target, exist_ok=True)
    names = sorted(os.listdir(directory), key=lambda name: name == TRAINER_STATE)
    for name in names:
        fs.put(os.path.join(directory, name), io.join(target, name), recursive=True)
    return target


def prune(
    found: list[tuple[str, dict]], keep: int, score: str, storage_options: dict | None = None
) -> list[tuple[str, dict]]:
    """Of :func:`persisted` checkpoints, keep the ``keep`` best by ``score`` and the newest (what a
    resume needs), as Ray Train's ``CheckpointConfig(num_to_keep)`` does; delete the rest from
    storage and return the kept ones, oldest epoch first."""
    kept = {path for path, _ in sorted(found, key=_rank(score), reverse=True)[:keep]}
    kept |= {path for path, _ in found[-1:]}
    for path, _ in found:
        if path not in kept:
            io.remove(path, storage_options)
    return [item for item in found if item[0] in kept]
