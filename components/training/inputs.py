"""Stage inputs (a model to start from) that every Ray Train worker can read, on any cluster.

A stage starts from a directory the driver wrote: a freshly built model, a cached encoder, the
previous stage's best checkpoint. The driver's disk is not the workers' (a CPU head node and GPU
worker nodes), but every worker reaches the run's storage, which Ray Train requires to be shared
(``s3://`` or a shared file system). So a directory outside the storage path is copied to
``<storage>/inputs/<name>``: read in place on a shared file system, downloaded once per worker
process from object storage (:func:`components.data.io.fetch`). Hub model names pass
through; each worker loads them itself.
"""

from __future__ import annotations

import os

from components.data import io
from components.training.spec import RunSpec

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
    target = io.join(run.storage_path, INPUTS, name)
    io.put_dir(path, target, run.storage_options)  # a rerun under the same name replaces its inputs
    return target
