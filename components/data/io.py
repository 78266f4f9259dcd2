"""File access for local paths and ``s3://`` URLs through fsspec (s3fs for S3).

S3 endpoints other than AWS (MinIO, a moto server in tests) come from ``AWS_ENDPOINT_URL`` or from
explicit ``storage_options``; credentials follow the usual boto chain.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from typing import Any

import fsspec
import pyarrow.fs as pafs

from components.data.parse import split_lines


def is_remote(path: str) -> bool:
    """True for URLs with a scheme other than ``file``."""
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> str:
    """``path`` without a ``file://`` scheme, for calls into ``os`` (which does not know URLs)."""
    return path[len("file://") :] if path.startswith("file://") else path


def storage_options_for(path: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Options for ``fsspec`` so that an ``AWS_ENDPOINT_URL`` is honoured by s3fs too."""
    opts = dict(storage_options or {})
    given = "client_kwargs" in opts or "endpoint_url" in opts  # s3fs takes it either way
    if path.startswith("s3://") and os.environ.get("AWS_ENDPOINT_URL") and not given:
        opts["client_kwargs"] = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}
    return opts


def filesystem(path: str, storage_options: dict[str, Any] | None = None) -> fsspec.AbstractFileSystem:
    """The fsspec filesystem that serves ``path``."""
    fs, _ = fsspec.core.url_to_fs(path, **storage_options_for(path, storage_options))
    return fs


def arrow_filesystem(path: str, storage_options: dict[str, Any] | None = None) -> pafs.FileSystem | None:
    """A pyarrow filesystem over fsspec for remote paths (so s3fs options apply), else None.

    Ray Data and Ray Train take pyarrow filesystems; wrapping the fsspec one keeps a single
    place where endpoints and credentials are set, and they travel with it to Ray's processes.
    """
    if not is_remote(path):
        return None
    return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem(path, storage_options)))


def join(base: str, *parts: str) -> str:
    """Join path parts with ``/`` for URLs and the OS separator for local paths."""
    if is_remote(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(local_path(base), *parts)


def same_path(a: str, b: str) -> bool:
    """Whether two paths name the same place: local ones resolved (``file://``, ``..``, links),
    URLs compared without a trailing ``/``."""
    if is_remote(a) or is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(local_path(a)) == os.path.realpath(local_path(b))


def exists(path: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether a file or directory exists at ``path``."""
    return filesystem(path, storage_options).exists(path)


def read_bytes(path: str, storage_options: dict[str, Any] | None = None) -> bytes:
    """The whole file at ``path`` as bytes."""
    with fsspec.open(path, "rb", **storage_options_for(path, storage_options)) as f:
        return f.read()


def write_bytes(path: str, data: bytes, storage_options: dict[str, Any] | None = None) -> None:
    """Write ``data`` to ``path``, creating parent directories for local paths.

    A local file is written beside its place and renamed into it, so a crash leaves the old file
    whole (an object store's put is already all or nothing).
    """
    if is_remote(path):
        with fsspec.open(path, "wb", **storage_options_for(path, storage_options)) as f:
            f.write(data)
        return
    path = local_path(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def publish_dir(src: str, dst: str) -> None:
    """Copy directory ``src`` to ``dst`` so that ``dst`` appears complete or not at all.

    The copy goes to a hidden sibling first and is renamed into place, so a crash mid-copy or a
    concurrent writer (parallel trials sharing a cache) never leaves a half-written ``dst``. If
    another writer published ``dst`` first, its copy is kept and this one dropped.
    """
    parent = os.path.dirname(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(dst)}.{uuid.uuid4().hex}.tmp")
    try:
        shutil.copytree(src, tmp)
        os.rename(tmp, dst)
    except OSError:
        if not os.path.isdir(dst):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed copy leaves no hidden half copy


def write_jsonl(path: str, rows: list[dict[str, Any]], storage_options: dict[str, Any] | None = None) -> None:
    """``rows`` as JSON lines (UTF-8, non-ASCII kept as is), written with :func:`write_bytes`."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    write_bytes(path, text.encode(), storage_options)


def read_jsonl(path: str, storage_options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The JSON lines at ``path`` (blank lines skipped); ``[]`` when there is no file yet.

    Lines end at "\n" only: :func:`write_jsonl` keeps U+2028 and U+0085 inside strings as they are,
    and ``str.splitlines`` would cut a record there.

    Raises:
        ValueError: a line is not JSON (naming the file and the line).
    """
    if not exists(path, storage_options):
        return []
    rows = []  # by the loader's splitter: lines end at "\n" only, a byte-order mark dropped
    for line in split_lines(read_bytes(path, storage_options)):
        if line.text is None or line.text.strip():
            try:
                rows.append(json.loads(line.raw))
            except ValueError as e:  # not JSON, or not UTF-8
                raise ValueError(f"{path}, line {line.number}: expected a JSON object: {e}") from e
    return rows


def makedirs(path: str, storage_options: dict[str, Any] | None = None) -> None:
    """Create a directory (a no-op on object stores, which have none)."""
    if not is_remote(path):
        os.makedirs(local_path(path), exist_ok=True)
    else:
        filesystem(path, storage_options).makedirs(path, exist_ok=True)


def remove(path: str, storage_options: dict[str, Any] | None = None) -> None:
    """Delete a file or a directory tree at ``path`` if there is one (stale output of a past run).

    Object by object from a listing: fsspec's ``rm`` reads ``[``, ``*`` and ``?`` in a path as a
    pattern, so removing ``s3://b/exp[1]`` deleted ``exp1`` beside it and left ``exp[1]``."""
    if not is_remote(path):
        target = local_path(path)
        if os.path.islink(target):  # the link only: what it points to belongs to someone else
            os.remove(target)
        elif os.path.isdir(target):
            shutil.rmtree(target)
        elif os.path.lexists(target):
            os.remove(target)
        return
    fs = filesystem(path, storage_options)
    for name in fs.find(path):  # a literal prefix listing, with the object itself for a file
        fs.rm_file(name)


def put_dir(src: str, dst: str, storage_options: dict[str, Any] | None = None) -> None:
    """Copy local directory ``src`` to ``dst`` (a local path or an object-store URL), replacing what
    was there.

    File by file from ``os.walk``, as :func:`remove` and :func:`fetch` go: fsspec's recursive
    ``put`` reads ``[``, ``*`` and ``?`` in the source as a pattern, so ``run[1]`` copied its
    sibling ``run1`` instead, without an error."""
    remove(dst, storage_options)
    fs = filesystem(dst, storage_options)
    for folder, _, names in os.walk(src):
        rel = os.path.relpath(folder, src)
        base = dst if rel == "." else join(dst, *rel.split(os.sep))
        if not is_remote(dst):  # an object store has no directories; a local copy keeps empty ones
            os.makedirs(local_path(base), exist_ok=True)
        for name in names:
            fs.put_file(os.path.join(folder, name), join(base, name))


def fetch(path: str, storage_options: dict | None = None) -> str:
    """A local directory with the contents of ``path``: itself if local, else a cached download.

    The download lands in a private directory first and is renamed into place, so processes on
    one node that fetch at once never read a half-copied model. The cache key covers each stored
    file's name, size and version marker, so an input re-uploaded under the same name is fetched
    again. The cache (``$TMPDIR/toolscout-inputs``) is not evicted: clear it on long-lived nodes.
    """
    if not is_remote(path):
        return path
    fs = filesystem(path, storage_options)
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
    root = fs._strip_protocol(path).rstrip("/")
    try:
        # File by file from the listing, as remove() deletes: fs.get would glob [ ] * in the path.
        for name, _, _ in listing:
            target = os.path.join(
                partial, os.path.relpath(name, root) if name != root else os.path.basename(name)
            )
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fs.get_file(name, target)
        os.rename(partial, local)
    except OSError:
        if not os.path.isdir(local):  # the download itself failed
            raise
        # another process got there first: keep its copy
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # a failed download leaves no half copy
    return local
