"""The driver's checks of a toolscout Serve config before it is deployed or swapped: the args as
the deployments were last given them, and the checks Serve's build task would run."""

from __future__ import annotations

import copy
import os
from typing import Any

IMPORT_PATH = "components.serving.app:build_app"


# The args naming a local file or dir (a URL or a ``models:/`` URI is left as it is).
PATH_KEYS = ("artifact", "catalog", "detector_artifact", "detector_file", "calibration_data")


def is_local(path: Any) -> bool:
    """Whether ``path`` is a local path (not a URL, not a registry URI)."""
    return isinstance(path, str) and bool(path) and "://" not in path and not path.startswith("models:/")


def relative_paths(args: dict[str, Any]) -> list[str]:
    """The args that may name a relative local path (dotted keys; a section's model may be a hub name)."""
    from components.serving.app import SECTION_FILES

    values = {key: args.get(key) for key in PATH_KEYS}
    values["registry.root"] = (args.get("registry") or {}).get("root")
    for section, keys in SECTION_FILES.items():
        values.update({f"{section}.{key}": (args.get(section) or {}).get(key) for key in keys})
    return [key for key, value in values.items() if is_local(value) and not os.path.isabs(value)]


def absolute_args(args: dict[str, Any], base: str | None = None) -> dict[str, Any]:
    """``args`` with local paths made absolute against ``base`` (default: this process's working
    directory): the app is built, and its replicas run, in Ray processes whose working directory
    differs. The optional sections' model files are made absolute where they exist
    (:func:`components.serving.app.local_files`: a hub name is left as it is)."""
    from components.serving.app import SECTION_FILES, local_files

    base = base or os.getcwd()
    args = copy.deepcopy(args)
    for key in PATH_KEYS:
        if is_local(args.get(key)):
            args[key] = os.path.abspath(os.path.join(base, args[key]))
    registry = dict(args.get("registry") or {})
    if is_local(registry.get("root")):
        registry["root"] = os.path.abspath(os.path.join(base, registry["root"]))
        args["registry"] = registry
    for section, keys in SECTION_FILES.items():
        if args.get(section):
            args[section] = local_files(args[section], keys, base)
    return args


def as_deployed(app: dict[str, Any], artifact: str | None = None, base: str | None = None) -> dict[str, Any]:
    """The app's args with the Retriever on ``artifact`` (else the version it was last given), and
    with relative local paths made absolute against ``base`` when given: the working directory of
    the replicas, where the app's build resolved them (a swap driver's own may differ).

    Once the app has been swapped (``artifact`` given, or user configs in the config), a pinned
    Detector stays as it was built, so its ``detector_artifact`` is not resolved again: a
    ``models:/`` alias removed since (or its model) failed every later swap and catalog refresh.
    """
    args = absolute_args(app.get("args") or {}, base) if base else dict(app.get("args") or {})
    given = {d["name"]: d.get("user_config") or {} for d in app.get("deployments") or []}
    args["artifact"] = artifact or given.get("Retriever", {}).get("artifact") or args.get("artifact")
    if (artifact or given.get("Retriever")) and not given.get("Detector"):
        # (A config file's Detector entry may hold options only: no user config, not redeployed.)
        args["detector_artifact"] = None  # not redeployed: its config is not built
    return args


def check_config(config: dict[str, Any], base: str | None = None) -> None:
    """Validate the toolscout application's args on the driver, before anything is deployed: the
    checks Serve's build task would run, as a clear :class:`ValueError`, not ``DEPLOY_FAILED``;
    relative paths as ``base`` resolves them (see :func:`as_deployed`)."""
    from pydantic import ValidationError

    from components.serving.app import ServeArgs, user_configs
    from components.serving.llm_app import LLM_IMPORT_PATH, LLMAppArgs

    for app in config["applications"]:
        try:
            if app.get("import_path") == IMPORT_PATH:
                # The versions the deployments are to serve; the ones the app was built with (args
                # stay as built, or Serve would restart it) may be gone by now.
                user_configs(ServeArgs.model_validate(as_deployed(app, base=base)))
            elif app.get("import_path") == LLM_IMPORT_PATH:
                LLMAppArgs.model_validate(app.get("args") or {})
        except ValidationError as e:
            raise ValueError(f"application {app.get('name')!r}: bad args: {e}") from e
