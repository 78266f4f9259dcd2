"""Optional dependencies: an installed distribution's version, or an error naming the extra to install."""

from __future__ import annotations

import importlib.metadata


def require_distribution(distribution: str, needed_by: str, extra: str = "pretrained") -> str:
    """The installed version of ``distribution`` (found without importing it).

    Raises:
        ModuleNotFoundError: it is not installed; the message says what needs it and which
            ``toolscout[extra]`` brings it.
    """
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModuleNotFoundError(
            f"{needed_by} needs the package {distribution}: pip install 'toolscout[{extra}]'"
        ) from e
