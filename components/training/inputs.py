"""Stage inputs (a model to start from) that every Ray Train worker can read, on any cluster.

A stage starts from a directory the driver wrote: a freshly built model, a cached encoder, the
previous stage's best checkpoint. On one machine, or with checkpoints on a shared file system,
workers read that path as is. With checkpoints in object storage (``s3://``), the driver's disk
is not the workers' (a CPU head node and GPU worker nodes): the driver puts the directory next
to the run's checkpoints and each worker process downloads it once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid

from components.data import io
from components.methods.base import RunSpec

INPUTS = "inputs"  # under the storage path, beside the runs


def share(path: str, run: RunSpec, name: str) -> str:
    """``path`` as every worker of ``run`` can read it.

    Local storage, a URL, or a name that is not a directory (a model hub id) come back unchanged;
    a local directory with remote storage is uploaded to ``<storage>/inputs/<name>``.
    """
    if not io.is_remote(run.storage_path) or io.is_remote(path) or not os.path.isdir(path):
        return path
    target = io.join(run.storage_path, INPUTS, name)
    fs = io.filesystem(target, run.storage_options)
    if fs.exists(target):
        fs.rm(target, recursive=True)  # a rerun under the same name replaces its inputs
    fs.put(path.rstrip("/") + "/", target, recursive=True)
    return target


def fetch(path: str, storage_options: dict | None = None) -> str:
    """A local directory with the contents of ``path``: itself if local, else a cached download.

    The download lands in a private directory first and is renamed into place, so processes on
    one node that fetch at once never read a half-copied model. The cache key covers each stored
    file's name, size and ETag, so an input re-uploaded under the same name is fetched again.
    """
    if not io.is_remote(path):
        return path
    fs = io.filesystem(path, storage_options)
    listing = sorted(
        (name, info.get("size"), str(info.get("ETag") or info.get("LastModified") or ""))
        for name, info in fs.find(path, detail=True).items()
    )
    if not listing:
        raise FileNotFoundError(f"stage input {path} is empty or missing")
    key = hashlib.sha1(repr((path, listing)).encode()).hexdigest()[:16]
    local = os.path.join(tempfile.gettempdir(), "toolscout-inputs", key)
    if os.path.isdir(local):
        return local
    partial = f"{local}.{uuid.uuid4().hex}.tmp"
    fs.get(path.rstrip("/") + "/", partial, recursive=True)
    try:
        os.rename(partial, local)
    except OSError:  # another process got there first: keep its copy
        shutil.rmtree(partial, ignore_errors=True)
    return local
