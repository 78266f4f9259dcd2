"""Versioned artifact directories: ``<root>/v0001``, ``<root>/v0002``, ... and a ``LATEST`` pointer.

``LATEST`` is a one-line text file naming the newest version, written after the version is
complete, so a reader never sees a half-written artifact.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid

LATEST = "LATEST"
_VERSION = re.compile(r"^v(\d{4,})$")


def versions(root: str) -> list[str]:
    """Existing version names under ``root``, oldest first."""
    if not os.path.isdir(root):
        return []
    found = [n for n in os.listdir(root) if _VERSION.match(n)]
    return sorted(found, key=lambda n: int(_VERSION.match(n).group(1)))


def next_version(root: str) -> str:
    """The directory the next version would get (not created; see :func:`reserve_version`)."""
    existing = versions(root)
    number = int(existing[-1][1:]) + 1 if existing else 1
    return os.path.join(root, f"v{number:04d}")


def reserve_version(root: str) -> str:
    """Create and return the directory of a new version, unique even among concurrent trainers.

    ``os.mkdir`` fails if the directory exists, so two runs that pick the same number at once
    cannot both get it: the loser takes the next one. The directory stays empty (and ``LATEST``
    unchanged) until the artifact is saved and promoted.
    """
    os.makedirs(root, exist_ok=True)
    while True:
        path = next_version(root)
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


def promote(version_dir: str) -> None:
    """Point ``LATEST`` (beside ``version_dir``) at it (the last promoter wins)."""
    root = os.path.dirname(os.path.abspath(version_dir))
    # A private temporary name: two promoters sharing one would rename each other's file away.
    tmp = os.path.join(root, f".{LATEST}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as f:
        f.write(os.path.basename(version_dir) + "\n")
    os.replace(tmp, os.path.join(root, LATEST))


def publish_dir(src: str, dst: str) -> None:
    """Copy directory ``src`` to ``dst`` so that ``dst`` appears complete or not at all.

    The copy goes to a hidden sibling first and is renamed into place, so a crash mid-copy or a
    concurrent writer (parallel ablation trials sharing a cache) never leaves a half-written
    ``dst``. If another writer published ``dst`` first, its copy is kept and this one dropped.
    """
    parent = os.path.dirname(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(dst)}.{uuid.uuid4().hex}.tmp")
    shutil.copytree(src, tmp)
    try:
        os.rename(tmp, dst)
    except OSError:
        if not os.path.isdir(dst):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def resolve(path: str) -> str:
    """An artifact dir from either itself or its parent holding ``LATEST``."""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    pointer = os.path.join(path, LATEST)
    if os.path.exists(pointer):
        with open(pointer) as f:
            return os.path.join(path, f.read().strip())
    return path
