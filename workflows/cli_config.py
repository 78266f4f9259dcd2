"""How every ``toolscout`` command builds its config and starts Ray (shared by the CLI modules)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

from components.config import ConfigError, load_config, load_yaml, merge


def packaged_config(name: str) -> dict[str, Any]:
    """A config shipped in ``workflows/configs``."""
    with resources.as_file(resources.files("workflows") / "configs" / f"{name}.yaml") as path:
        return load_yaml(path)


def build_config(
    config: Path | None, overrides: list[str] | None, base: str | None = None, **flags: Any
) -> dict:
    """Defaults (+ a packaged base config), then the user's file, then CLI flags, then overrides.

    Flags arrive as ``section__key=value`` keyword arguments; ``None`` means "not given".
    """
    defaults = packaged_config("default")
    if base:
        defaults = merge(defaults, packaged_config(base))
    cfg = load_config(config, [], defaults)
    for dotted, value in flags.items():
        if value is not None:
            *parents, leaf = dotted.split("__")
            node = cfg
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
    return load_config(None, overrides or [], cfg)


def require(cfg: dict, dotted: str, flag: str) -> None:
    """Fail early, naming the flag, when a required setting is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node in (None, ""):
        raise ConfigError(f"{dotted} is not set: pass {flag} or set it in the config")


def start_ray(cfg: dict) -> None:
    """Start or join Ray for commands that run Ray jobs.

    Hugging Face's progress bars ("Loading weights", "Writing model shards": one per model load in
    every stage, trial and evaluation) and advisory warnings are switched off first, here and,
    through the environment, in the processes of a local Ray started next; a user's own setting of
    those variables wins.
    """
    from workflows.quiet import QUIET_ENV, quiet_libraries
    from workflows.ray_env import init_ray

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    quiet_libraries()
    init_ray(cfg.get("ray"))
