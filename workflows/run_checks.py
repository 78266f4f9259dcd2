"""What ``toolscout run`` checks before it generates data or starts Ray, and how it reads ``run.params``.

The quickstart decides several settings itself (where the registry, checkpoints and prepared data
live; the model names; which artifact each evaluation reads): a config that sets one of them, by a
command-line override or in a ``-c`` file, is refused rather than silently replaced.
"""

from __future__ import annotations

import re
from typing import Any

from components.config import ConfigError, as_list, dotted, merge
from components.data.quickstart import WORDINGS

ARTIFACT_REF = re.compile(r"\{artifact:(\w+)\}")  # in run.params: a method trained earlier in the run

# Settings `toolscout run` sets itself: everything under run.workdir, the registered model names
# (quickstart-<method>) and the artifact each evaluation reads (the one just trained).
RUN_DECIDES = (
    "registry.root",
    "registry.model_name",
    "train.storage_path",
    "train.local_dir",
    "preprocess.output",
    "evaluate.artifact",
)


def shipped_config() -> dict[str, Any]:
    """The packaged default and quickstart configs merged, as ``toolscout run`` starts from them."""
    from workflows.cli_config import packaged_config

    return merge(packaged_config("default"), packaged_config("quickstart"))


def run_methods(cfg: dict[str, Any]) -> list[str]:
    """The methods the run trains: ``run.methods``, else the config's ``method.name``."""
    return [str(n) for n in as_list(cfg["run"].get("methods") or [cfg["method"]["name"]], "run.methods")]


def method_params(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """``run.params.<name>``; without ``run.methods`` the config's own ``method.params`` go over it
    (the method section is then the one run, its params included)."""
    params = (cfg["run"].get("params") or {}).get(name) or {}
    if not cfg["run"].get("methods"):
        params = merge(params, cfg["method"].get("params") or {})
    return params


def check_run_settings(cfg: dict[str, Any]) -> None:
    """``run.*`` values of the right type and range, named when they are not.

    Raises:
        ConfigError: a bad ``run.workdir``, ``run.seed``, ``run.n_queries``, ``run.n_neg`` or
            ``run.wording``, or an ``evaluate.splits`` that is not a list of split names.
    """
    rcfg = cfg["run"]
    if not isinstance(rcfg.get("workdir"), str) or not rcfg["workdir"].strip():
        raise ConfigError(f"run.workdir: expected a directory path, got {rcfg.get('workdir')!r}")
    for key, least in (("seed", 0), ("n_queries", 10), ("n_neg", 0)):
        value = rcfg.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"run.{key}: expected an integer >= {least}, got {value!r}")
    if rcfg.get("wording", "held_out") not in WORDINGS:
        raise ConfigError(f"run.wording: expected one of {list(WORDINGS)}, got {rcfg.get('wording')!r}")
    splits = as_list((cfg.get("evaluate") or {}).get("splits", ["valid"]), "evaluate.splits")
    if not splits or not all(isinstance(s, str) and s for s in splits):
        raise ConfigError(f"evaluate.splits: expected a list of split names, got {splits!r}")


def check_overrides(overrides: list[str] | None, cfg: dict[str, Any]) -> None:
    """Refuse settings the quickstart would silently ignore or replace, before any work.

    Raises:
        ConfigError: a ``method.*`` key while ``run.methods`` lists the methods (their params come
            from ``run.params``); a setting ``toolscout run`` decides itself (:data:`RUN_DECIDES`),
            from the command line or a config file; params for a method the run does not train; a
            misspelt method; an artifact reference to a later method; a bad ``run.*`` value.
    """
    check_run_settings(cfg)
    listed = cfg["run"].get("methods")
    shipped = shipped_config()
    keys = [item.partition("=")[0].strip() for item in overrides or []]
    for key in keys:
        if key.startswith("method.") and listed:
            raise ConfigError(
                f"toolscout run: {key} is not used while run.methods lists the methods ({listed}); "
                "give a method's params as run.params.<method>.<param>, e.g. run.params.dense.epochs=1"
            )
    for key in RUN_DECIDES:
        if dotted(cfg, key) != dotted(shipped, key):
            raise ConfigError(
                f"toolscout run: {key} is decided by the run (everything lands under run.workdir, "
                f"models register as quickstart-<method>); got {dotted(cfg, key)!r}: set run.workdir instead"
            )
    if listed and cfg["method"] != shipped["method"]:  # a config file's method section (train's)
        raise ConfigError(
            f"toolscout run: the config's method section ({cfg['method'].get('name')!r}) is not used "
            f"while run.methods lists the methods ({listed}); set run.methods and run.params instead"
        )
    # Before any data is generated or Ray started: a misspelt method, params for a method not run
    # (`run.params.desne.epochs=1`, never read) or an artifact reference to a later method.
    from components.methods import method_class

    names = run_methods(cfg)
    for name in names:
        try:
            method_class(name)
        except (KeyError, ValueError) as e:
            raise ConfigError(f"toolscout run: run.methods: {e}") from None
    # The shipped params of a method left out of run.methods are simply unused; any other is a typo,
    # and so is one given on the command line for a method the run leaves out.
    given = {key.split(".")[2] for key in keys if key.startswith("run.params.")}
    stray = sorted((set(cfg["run"].get("params") or {}) - set(shipped["run"]["params"]) | given) - set(names))
    if stray:
        raise ConfigError(f"toolscout run: run.params has {stray}, which run.methods ({names}) does not run")
    if cfg["run"].get("n_neg", 0) == 0 and "masstool" in names:
        # MassTool selects on detection too only with no-tool queries in valid; the generated data
        # has none without n_neg, and it failed after the methods before it had trained.
        metric = str(method_params(cfg, "masstool").get("select_metric", "ndcg@3"))
        if metric == "joint" or metric.startswith("detect_"):
            raise ConfigError(
                f"toolscout run: run.n_neg=0 generates no no-tool queries, which masstool's "
                f"select_metric {metric!r} needs in valid; set run.n_neg > 0 or "
                "run.params.masstool.select_metric=ndcg@3"
            )
    for i, name in enumerate(names):
        earlier = dict.fromkeys(names[:i], "")
        try:
            resolve_artifacts(method_params(cfg, name), earlier)
        except ValueError as e:
            raise ConfigError(f"toolscout run: run.params.{name}: {e}") from None


def resolve_artifacts(params: Any, artifacts: dict[str, str]) -> Any:
    """``params`` with each ``{artifact:NAME}`` in a string replaced by the artifact dir of NAME.

    Raises:
        ValueError: NAME is not among ``artifacts`` (the methods trained earlier in the run).
    """
    if isinstance(params, dict):
        return {k: resolve_artifacts(v, artifacts) for k, v in params.items()}
    if isinstance(params, list):
        return [resolve_artifacts(v, artifacts) for v in params]
    if not isinstance(params, str):
        return params
    for name in ARTIFACT_REF.findall(params):
        if name not in artifacts:
            raise ValueError(f"{params!r} names {name!r}, which run.methods does not train before it")
    return ARTIFACT_REF.sub(lambda m: artifacts[m.group(1)], params)
