"""The driver's checks of a toolscout Serve config before it is deployed or swapped: the args as
the deployments were last given them, and the checks Serve's build task would run."""

from __future__ import annotations

from typing import Any

IMPORT_PATH = "components.serving.app:build_app"


def as_deployed(app: dict[str, Any], artifact: str | None = None) -> dict[str, Any]:
    """The app's args with the Retriever on ``artifact`` (else the version it was last given).

    Once the app has been swapped (``artifact`` given, or user configs in the config), a pinned
    Detector stays as it was built, so its ``detector_artifact`` is not resolved again: a
    ``models:/`` alias removed since (or its model) failed every later swap and catalog refresh.
    """
    args = dict(app.get("args") or {})
    given = {d["name"]: d.get("user_config") or {} for d in app.get("deployments") or []}
    args["artifact"] = artifact or given.get("Retriever", {}).get("artifact") or args.get("artifact")
    if (artifact or given.get("Retriever")) and not given.get("Detector"):
        # (A config file's Detector entry may hold options only: no user config, not redeployed.)
        args["detector_artifact"] = None  # not redeployed: its config is not built
    return args


def check_config(config: dict[str, Any]) -> None:
    """Validate the toolscout application's args on the driver, before anything is deployed: the
    checks Serve's build task would run, as a clear :class:`ValueError`, not ``DEPLOY_FAILED``."""
    from pydantic import ValidationError

    from components.serving.app import ServeArgs, user_configs
    from components.serving.llm_app import LLM_IMPORT_PATH, LLMAppArgs

    for app in config["applications"]:
        try:
            if app.get("import_path") == IMPORT_PATH:
                # The versions the deployments are to serve; the ones the app was built with (args
                # stay as built, or Serve would restart it) may be gone by now.
                user_configs(ServeArgs.model_validate(as_deployed(app)))
            elif app.get("import_path") == LLM_IMPORT_PATH:
                LLMAppArgs.model_validate(app.get("args") or {})
        except ValidationError as e:
            raise ValueError(f"application {app.get('name')!r}: bad args: {e}") from e
