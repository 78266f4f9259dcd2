"""The model registry on MLflow: every trained artifact is a run and a version of a named model.

A version's files are the artifact directory exactly as a method saves it (``config.json`` +
safetensors / ``.npy``, no pickle), logged under the run's ``model/`` path. Three aliases carry
the lifecycle (:mod:`workflows.retrain`): ``champion`` (what serving follows), ``challenger``
(the last candidate a retrain trained) and ``previous`` (the champion before the last promotion,
what :meth:`ModelRegistry.rollback` returns to).

The embedded default is a sqlite store and local artifacts under ``root``; a cluster sets
``MLFLOW_TRACKING_URI`` to an MLflow server (``deploy/mlflow.yaml``) with artifacts on s3://.

A model reference is a directory or a registry URI (``models:/<name>@<alias>``, ``.../<version>``
or ``.../latest``); :func:`resolve` turns a URI into ``<root>/versions/<name>/v<N>`` (a link to
local artifacts, else a download), so loading code only sees directories, whose last two parts
are the version that answers in serving.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from components.config import flatten
from components.registry.create import ensure_registered_model, experiment_id
from components.registry.local import MODEL_PATH, materialise
from components.registry.lock import AliasLock, LockHeld
from components.registry.moves import move, settle
from components.registry.params import unflatten
from components.registry.settings import ALIASES, RegistrySettings, Version, parse_model_uri, quiet_mlflow
from components.registry.sqlite_template import create_from_template

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
ANY = object()  # promote(replacing=ANY): whatever the champion is


class ChampionMoved(LookupError):
    """The champion is not the version a conditional promotion expected."""


class ModelRegistry:
    """A thin, typed layer over :class:`mlflow.MlflowClient` for toolscout's lifecycle."""

    def __init__(self, settings: RegistrySettings | None = None) -> None:
        from mlflow import MlflowClient

        quiet_mlflow()
        self.settings = settings or RegistrySettings()
        uri = self.settings.resolved_uri
        if self.settings.embedded:
            os.makedirs(self.settings.root, exist_ok=True)
            create_from_template(self.settings.sqlite_path)  # migrated once per process
        self.client = MlflowClient(tracking_uri=uri, registry_uri=uri)

    # -- writing ------------------------------------------------------------------------------
    def log_version(
        self,
        name: str,
        artifact_dir: str,
        params: dict[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
    ) -> Version:
        """Log ``artifact_dir`` as a new run of experiment ``name`` and register it as a version.

        The version is created only after every file is logged, so a failure part-way leaves a
        failed run and no version: nothing that serving or an alias could point at.
        """
        if not _NAME.match(name):
            raise ValueError(f"bad model name {name!r}: letters, digits, '.', '_' and '-' only")
        if not os.path.isfile(os.path.join(artifact_dir, "config.json")):
            raise ValueError(f"{artifact_dir}: not a saved method (no config.json)")
        from mlflow.entities import Metric, Param, RunTag

        run = self.client.create_run(experiment_id(self.client, self.settings, name), tags=dict(tags or {}))
        run_id = run.info.run_id
        try:
            flat = {k: str(v)[:6000] for k, v in flatten(params or {}).items()}
            self.client.log_batch(
                run_id,
                params=[Param(k, v) for k, v in sorted(flat.items())],
                metrics=[Metric(k, float(v), 0, 0) for k, v in sorted((metrics or {}).items())],
                tags=[RunTag("toolscout.model", name)],
            )
            self.client.log_artifacts(run_id, artifact_dir, MODEL_PATH)
        except BaseException:
            self.client.set_terminated(run_id, "FAILED")
            raise
        self.client.set_terminated(run_id, "FINISHED")
        ensure_registered_model(self.client, name)
        mv = self.client.create_model_version(
            name, f"{run.info.artifact_uri}/{MODEL_PATH}", run_id=run_id, tags=dict(tags or {})
        )
        return self.version(name, int(mv.version))

    def log_saved(
        self,
        name: str,
        save: Callable[[str], None],
        params: dict[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
    ) -> Version:
        """:meth:`log_version` of what ``save(dir)`` writes into a private staging directory
        under ``root`` (removed afterwards, whatever happens)."""
        staging_root = os.path.join(self.settings.root, "staging")
        os.makedirs(staging_root, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f"{name}-", dir=staging_root)
        try:
            save(staging)
            return self.log_version(name, staging, params, metrics, tags)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def set_tag(self, name: str, number: int, key: str, value: str) -> None:
        """Tag version ``number`` of ``name`` (e.g. a retrain's final decision)."""
        self.client.set_model_version_tag(name, str(number), key, value)

    def set_alias(self, name: str, alias: str, number: int | None) -> None:
        """Point ``alias`` at version ``number`` (``None`` removes the alias)."""
        if alias not in ALIASES:
            raise ValueError(f"unknown alias {alias!r}; toolscout uses {ALIASES}")
        if number is None:
            if alias in self.aliases(name):
                self.client.delete_registered_model_alias(name, alias)
            return
        self.client.set_registered_model_alias(name, alias, str(number))

    def name_challenger(self, name: str, number: int) -> None:
        """Point ``challenger`` at version ``number`` under the alias lock: a promotion reads the
        aliases and then moves them, and a challenger set between the two was removed with the
        old one, leaving the new version in no alias. A lock not freed within its wait (a move
        that died on another host) cannot be moving aliases: the alias is set anyway."""
        try:
            with AliasLock(self.settings.alias_lock):
                self.set_alias(name, "challenger", number)
        except LockHeld:
            self.set_alias(name, "challenger", number)

    def promote(self, name: str, number: int, replacing: int | object | None = ANY) -> Version | None:
        """Make version ``number`` the champion (the old one becomes ``previous``) under the alias
        lock (:class:`.lock.AliasLock`); with ``replacing`` (a number; ``None``: no champion) only
        while the champion is that version (what a retrain gated against). Returns the replaced one.

        Raises:
            ChampionMoved: ``replacing`` is given and the champion is another version.
        """
        self.lookup(f"models:/{name}/{number}")  # an unknown version: a LookupError, before the lock
        with AliasLock(self.settings.alias_lock):
            settle(self, name)  # a move a crash left half done is finished first (.moves)
            aliases = self.aliases(name)
            old = aliases.get("champion")
            if replacing is not ANY and old != replacing:
                raise ChampionMoved(f"model {name!r}: champion is v{old}, not v{replacing}")
            if old == number:
                return None
            wanted = ({"previous": old} if old is not None else {}) | {"champion": number}
            wanted |= {"challenger": None} if aliases.get("challenger") == number else {}  # it won
            move(self, name, wanted)
        return self.version(name, old) if old is not None else None

    def rollback(self, name: str) -> Version:
        """Move ``champion`` back to ``previous`` (under the alias lock); the demoted version
        becomes ``previous``, so a second rollback undoes the first. Returns the new champion.

        Raises:
            LookupError: the model has no ``previous`` version.
        """
        with AliasLock(self.settings.alias_lock):
            settle(self, name)
            aliases = self.aliases(name)
            if "previous" not in aliases:
                raise LookupError(f"model {name!r} has no 'previous' version to roll back to")
            if aliases["previous"] == aliases.get("champion"):
                # Left by a move written before moves were recorded: rolling back moves nothing.
                raise LookupError(
                    f"model {name!r}: 'previous' and 'champion' are both v{aliases['previous']}; "
                    "nothing to roll back to (promote the version wanted by number)"
                )
            move(self, name, {"champion": aliases["previous"], "previous": aliases.get("champion")})
        return self.version(name, aliases["previous"])

    # -- reading ------------------------------------------------------------------------------
    def version(self, name: str, number: int) -> Version:
        return self._version(self.client.get_model_version(name, str(number)))

    def _version(self, mv: Any, aliases: tuple[str, ...] | None = None) -> Version:
        """A :class:`Version` from an MLflow ``ModelVersion`` (plus its run's metrics)."""
        return Version(
            name=mv.name,
            number=int(mv.version),
            run_id=mv.run_id or "",
            source=mv.source,
            aliases=aliases if aliases is not None else tuple(sorted(mv.aliases or [])),
            metrics=self._run_metrics(mv.run_id),
            tags=dict(mv.tags or {}),
        )

    def _run_metrics(self, run_id: str | None) -> dict[str, float]:
        """The metrics of the run that logged a version; empty when it has none, or when the run
        is gone (``mlflow gc`` after a deleted run): the version, its files and aliases remain."""
        from mlflow.exceptions import MlflowException

        if not run_id:
            return {}
        try:
            return dict(self.client.get_run(run_id).data.metrics)
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return {}
            raise

    def alias(self, name: str, alias: str) -> Version | None:
        """The version ``alias`` points at, or ``None``."""
        from mlflow.exceptions import MlflowException

        try:
            found = self.client.get_model_version_by_alias(name, alias)
        except MlflowException as e:
            # An unknown model or an unset alias. A failing server is an error, not "no champion"
            # (a promotion would drop the champion from previous), and so is a gc'd run (a
            # retrain read it as no champion and promoted ungated): only this read says "not set".
            if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise
        return self._version(found)

    def numbers(self, name: str) -> list[int]:  # oldest first, one search: no run read per version
        return sorted(int(mv.version) for mv in self.client.search_model_versions(f"name = '{name}'"))

    def versions(self, name: str) -> list[Version]:
        """Every version of ``name``, oldest first (empty for an unknown model)."""
        found = sorted(self.client.search_model_versions(f"name = '{name}'"), key=lambda mv: int(mv.version))
        # Search results carry no aliases: they come from the registered model, in one read.
        by_version: dict[int, list[str]] = {}
        for alias, number in self.aliases(name).items():
            by_version.setdefault(number, []).append(alias)
        return [self._version(mv, tuple(sorted(by_version.get(int(mv.version), [])))) for mv in found]

    def aliases(self, name: str) -> dict[str, int]:
        """``{alias: version}`` of the model's aliases that are set (empty for an unknown model)."""
        from mlflow.exceptions import MlflowException

        try:
            found = self.client.get_registered_model(name).aliases or {}
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":  # an unknown model has no aliases
                return {}
            raise
        return {alias: int(found[alias]) for alias in ALIASES if alias in found}

    def lookup(self, ref: str) -> Version:
        """The version a ``models:/`` URI names.

        Raises:
            LookupError: the model, version or alias does not exist.
        """
        from mlflow.exceptions import MlflowException

        name, alias, number = parse_model_uri(ref)
        try:
            if alias is not None:
                found = self.alias(name, alias)
                if found is None:
                    raise LookupError(f"{ref}: model {name!r} has no alias {alias!r}")
                return found
            if number == "latest":
                every = self.numbers(name)
                if not every:
                    raise LookupError(f"{ref}: model {name!r} has no versions")
                return self.version(name, every[-1])
            return self.version(name, int(number))
        except MlflowException as e:
            raise LookupError(f"{ref}: {e.message}") from e

    def params(self, version: Version, section: str) -> Any:
        """The config ``section`` the version's run logged, typed again (:func:`.params.unflatten`).

        Raises:
            LookupError: the run did not log it, or is gone (``mlflow gc``; the version remains).
        """
        from mlflow.exceptions import MlflowException

        try:
            logged = self.client.get_run(version.run_id).data.params if version.run_id else {}
            return unflatten(dict(logged), section)
        except KeyError:
            raise LookupError(f"{version.name} v{version.number}: its run logged no {section!r}") from None
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                raise LookupError(f"{version.name} v{version.number}: its run is gone") from None
            raise

    def local_dir(self, version: Version) -> str:
        """``<root>/versions/<name>/v<N>`` with the version's files (:func:`.local.materialise`)."""
        return materialise(version, self.settings)
