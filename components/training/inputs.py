"""Stage inputs (a model to start from) that every Ray Train worker can read, on any cluster.

A stage starts from a directory the driver wrote: a freshly built model, a cached encoder, the
previous stage's best checkpoint. The driver's disk is not the workers' (a CPU head node and GPU
worker nodes), but every worker reaches the run's storage, which Ray Train requires to be shared
(``s3://`` or a shared file system). So a directory outside the storage path is copied to
``<storage>/inputs/<name>``: read in place on a shared file system, downloaded once per worker
process from object storage. Hub model names pass through; each worker loads them itself.
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

    A URL, a name that is not a directory (a model hub id) or a directory already inside a local
    storage path come back unchanged; any other directory is copied to ``<storage>/inputs/<name>``.
    """
    if io.is_remote(path) or not os.path.isdir(path):
        return path
    if not io.is_remote(run.storage_path):
        root, here = os.path.abspath(run.storage_path), os.path.abspath(path)
        if here == root or here.startswith(root + os.sep):
            return path
    # One fsspec copy for both: a local file system or an object store.
    target = io.join(run.storage_path, INPUTS, name)
    io.remove(target, run.storage_options)  # a rerun under the same name replaces its inputs
    io.filesystem(target, run.storage_options).put(path.rstrip("/") + "/", target, recursive=True)
    return target


def fetch(path: str, storage_options: dict | None = None) -> str:
    """A local directory with the contents of ``path``: itself if local, else a cached download.

    The download lands in a private directory first and is renamed into place, so processes on
    one node that fetch at once never read a half-copied model. The cache key covers each stored
    file's name, size and version marker, so an input re-uploaded under the same name is fetched
    again. The cache (``$TMPDIR/toolscout-inputs``) is not evicted: clear it on long-lived nodes.
    """
    if not io.is_remote(path):
        return path
    fs = io.filesystem(path, storage_options)
    # Whatever version marker the store gives (s3fs: ETag / LastModified, gcsfs: etag / updated).
    markers = ("ETag", "etag", "LastModified", "updated", "mtime")
    listing = sorted(
        (name, info.get("size"), str(next((info[m] for m in markers if info.get(m)), "")))
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
