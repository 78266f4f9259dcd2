"""A registered version's files on this machine: ``<root>/versions/<name>/v<N>``.

Loading code only ever sees directories, and the directory's last two parts (``<name>/v<N>``) are
the version serving reports.
"""

from __future__ import annotations

import os
import shutil
import uuid
from urllib.parse import urlparse

from components.registry.settings import RegistrySettings, Version

MODEL_PATH = "model"  # where a run's artifact directory is logged


def materialise(version: Version, settings: RegistrySettings) -> str:
    """The local directory of ``version``, created once per version and machine, atomically.

    A link when the logged files are on this disk; a download into a hidden sibling, renamed into
    place, when a tracking server holds them (``mlflow-artifacts:/``, or ``s3://``).
    """
    target = os.path.abspath(os.path.join(settings.root, "versions", version.name, f"v{version.number}"))
    # Which logged files the directory holds: two registries (another sqlite file, a tracking
    # server instead of the embedded store) can share a root and both have a version 1 of a model.
    marker = f"{target}.source"
    if os.path.exists(os.path.join(target, "config.json")):
        if os.path.exists(marker):
            with open(marker) as f:
                held = f.read()
            if held != version.source:
                raise ValueError(
                    f"{target} holds {held}, not {version.name} v{version.number} of this registry "
                    f"({version.source}): give each registry its own registry.root"
                )
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.{uuid.uuid4().hex}.tmp"
    source = urlparse(version.source)
    if source.scheme in ("", "file"):
        os.symlink(os.path.abspath(source.path), tmp)
    else:
        import mlflow.artifacts

        os.makedirs(tmp)
        try:
            mlflow.artifacts.download_artifacts(
                artifact_uri=version.source, dst_path=tmp, tracking_uri=settings.resolved_uri
            )
            inner = os.path.join(tmp, MODEL_PATH)  # the download keeps the last path part
            if os.path.isdir(inner) and not os.path.exists(os.path.join(tmp, "config.json")):
                for entry in os.listdir(inner):
                    os.rename(os.path.join(inner, entry), os.path.join(tmp, entry))
                os.rmdir(inner)
        except BaseException:  # a failed download leaves no partial copy for each retry to add to
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    try:
        os.rename(tmp, target)
    except OSError:  # another process materialised it first: keep theirs
        if os.path.islink(tmp):
            os.unlink(tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        return target
    with open(f"{tmp}.source", "w") as f:  # renamed into place whole: never read half-written
        f.write(version.source)
    os.replace(f"{tmp}.source", marker)
    return target
