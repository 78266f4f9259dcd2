"""Where the registry lives, and the names it hands out: settings, versions, ``models:/`` URIs."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

ALIASES = ("champion", "challenger", "previous")
DEFAULT_ROOT = "runs/registry"
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[\w-]+)|/(?P<version>\d+|latest))$")


@dataclass(frozen=True)
class RegistrySettings:
    """Where the registry lives (the ``registry`` config section).

    Attributes:
        tracking_uri: An MLflow tracking URI; ``None``: ``$MLFLOW_TRACKING_URI``, else a sqlite
            file ``<root>/mlflow.db`` (works with no server).
        root: Local directory for the sqlite store, the default artifact store and the local copies
            of versions that serving loads.
        artifact_root: Where new models' artifacts go (``s3://bucket/prefix`` on a cluster); ``None``:
            the server's default, or ``<root>/artifacts`` for the embedded store.
    """

    tracking_uri: str | None = None
    root: str = DEFAULT_ROOT
    artifact_root: str | None = None

    @classmethod
    def from_config(cls, section: dict[str, Any] | None) -> RegistrySettings:
        section = dict(section or {})
        return cls(
            tracking_uri=section.get("tracking_uri"),
            root=section.get("root") or DEFAULT_ROOT,
            artifact_root=section.get("artifact_root"),
        )

    @property
    def resolved_uri(self) -> str:
        """The tracking URI in effect (the embedded sqlite store as an absolute path)."""
        if self.embedded:
            return f"sqlite:///{self.sqlite_path}"
        return self.tracking_uri or os.environ["MLFLOW_TRACKING_URI"]

    @property
    def sqlite_path(self) -> str:
        """The embedded store's database file (absolute)."""
        return os.path.abspath(os.path.join(self.root, "mlflow.db"))

    @property
    def embedded(self) -> bool:
        """Whether this is the sqlite store under ``root`` (no URI given, none in the environment)."""
        return not (self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))

    @property
    def retrain_lock(self) -> str:
        """The lock file a retrain round holds, beside the registry's local state
        (:class:`components.registry.RetrainLock`)."""
        return os.path.join(self.root, "retrain.lock")

    @property
    def alias_lock(self) -> str:
        """The lock file of an alias move (:class:`components.registry.AliasLock`)."""
        return os.path.join(self.root, "alias.lock")

    def as_config(self) -> dict[str, Any]:
        """Absolute and explicit: what a process with another working directory (a Serve build
        task, a Ray worker) needs to reach the same registry."""
        return {
            "tracking_uri": self.resolved_uri,
            "root": os.path.abspath(self.root),
            "artifact_root": self.artifact_root,
        }


@dataclass(frozen=True)
class Version:
    """One registered version: its number, the run that logged it, and where its files are."""

    name: str
    number: int
    run_id: str
    source: str
    aliases: tuple[str, ...]
    metrics: dict[str, float]
    tags: dict[str, str]

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.number}"


def parse_model_uri(ref: str) -> tuple[str, str | None, str | None]:
    """``(name, alias, version)`` of a ``models:/`` URI (one of alias / version is set).

    Raises:
        ValueError: ``ref`` starts with ``models:/`` but is not one of the three accepted forms.
    """
    m = _URI.match(ref)
    if not m:
        raise ValueError(
            f"bad model URI {ref!r}: expected models:/<name>@<alias>, models:/<name>/<version> "
            "or models:/<name>/latest"
        )
    return m.group("name"), m.group("alias"), m.group("version")


def is_model_uri(ref: str) -> bool:
    return ref.startswith("models:/")


def quiet_mlflow() -> None:
    """MLflow and its migrations log every table update at INFO, and a client talking to a server
    prints a "View run" link on stdout per run (where commands print their report): warnings only."""
    for name in ("mlflow", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
