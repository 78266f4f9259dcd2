"""Hot-swapping a running app: following a registry alias, and reloading a changed catalog.

Both rebuild the deployments' user configs only (:func:`swap_artifact`), so a redeploy
(:func:`components.serving.deploy.deploy_config`) reconfigures the replicas in place: no restart,
no dropped request. Each then asks the replicas what they serve, since a replica that could not
load the new version keeps serving its old one (:func:`components.serving.batch_calls.load_new`).

Two drivers may swap one app at once (a retrain round's ``--follow`` and an operator's rollback):
Serve applies each config whole, so the later deploy wins. A swap that finds its config replaced
by another deploy does not undo it (:func:`superseded`), and a follow checks, once its swap is in,
whether its alias still names what it deployed.
"""

from __future__ import annotations

import copy
from typing import Any

from ray.serve.context import _get_global_client

from components.serving.deploy import APP_NAME, deploy_config
from components.serving.deploy_checks import as_deployed, relative_paths
from components.serving.replicas import replica_answers
from components.serving.swap_calibration import calibrate_here

# How often a follow deploys again because its alias moved while it swapped: each round is another
# follower's move seen after this one's swap, so more than a few means the alias keeps moving.
FOLLOW_ROUNDS = 3


class SwapFailed(RuntimeError):
    """A hot-swap that replicas did not take; the app was put back on what it served."""


def swap_artifact(config: dict[str, Any], artifact: str, base: str | None = None) -> dict[str, Any]:
    """``config`` with the Retriever's user config (and the Detector's, unless the args pin a
    ``detector_artifact``) pointing at another artifact. Only ``deployments[].user_config``
    changes, so redeploying it reconfigures replicas in place. Each user config is written whole,
    as :func:`components.serving.app.user_configs` builds it: Serve replaces a ``user_config`` as
    a unit, so a partial one would drop the detector file, calibration data and batching settings.
    ``artifact`` is checked (its ``config.json`` names a known method); a registry URI is pinned.
    Relative paths in the args are read against ``base`` (:func:`replicas_dir`), as the app's build
    read them; the args themselves are left as they are (changed, Serve would restart the app).

    Raises:
        ValueError: ``artifact`` is not a loadable artifact directory.
    """
    from components.serving.app import ServeArgs, user_configs

    config = copy.deepcopy(config)
    app = config["applications"][0]
    deployments = {d["name"]: d for d in app.get("deployments") or []}
    configs = user_configs(ServeArgs.model_validate(as_deployed(app, artifact, base)))
    # A pinned detector keeps what it serves: rebuilt, its registry alias was resolved again and
    # the Detector moved, unchecked, to whatever the alias named now.
    names = swapped_deployments(config)
    if has_selector(config):
        names.append("Selector")  # it reads the same catalog (catalog_version)
    for name in names:
        deployments.setdefault(name, {"name": name})["user_config"] = configs[name]
    app["deployments"] = list(deployments.values())
    return config


def has_selector(config: dict[str, Any]) -> bool:
    """Whether the first application of ``config`` runs a Selector (a ``selector`` backend in its args)."""
    return (config["applications"][0]["args"].get("selector") or {}).get("backend", "none") != "none"


def replicas_dir(config: dict[str, Any], app_name: str = APP_NAME) -> str | None:
    """Where the running app read its args' relative paths (``serve deploy`` of a file such as
    deploy/rayservice.yaml keeps them so): its Retriever replicas' working directory, asked; None when
    there are none. A driver's own (a submitted job's working_dir) would read another catalog or none.

    Raises:
        SwapFailed: the replicas run in different directories (then no one base holds for all).
    """
    relative = relative_paths(config["applications"][0].get("args") or {})
    if not relative:
        return None
    dirs = asked("Retriever", "working_dir", app_name)
    if len(dirs) != 1:
        raise SwapFailed(
            f"args {relative} are relative paths, and the Retriever replicas run in {sorted(dirs)}: "
            "deploy the app with absolute paths (toolscout serve makes them so)"
        )
    return next(iter(dirs))


def running_config(app_name: str = APP_NAME) -> dict[str, Any]:
    """The Serve config the running ``app_name`` was deployed with (as :func:`deploy_config` sent it),
    followed by the other applications deployed with it: Serve's config deploys are declarative, so
    a redeploy that left them out would delete them.

    Raises:
        LookupError: no application of that name was deployed from a config on this cluster.
    """
    details = _get_global_client().get_serve_details()
    deployed = {
        name: app.get("deployed_app_config") for name, app in (details.get("applications") or {}).items()
    }
    if not deployed.get(app_name):
        raise LookupError(f"no Serve application {app_name!r} deployed from a config is running")
    others = [config for name, config in sorted(deployed.items()) if name != app_name and config]
    return {"applications": [deployed[app_name], *others]}


def serving_artifacts(
    app_name: str = APP_NAME, calls_per_replica: int = 8, deployment: str = "Retriever"
) -> set[str]:
    """The artifact directories the app's ``deployment`` replicas answer with; a replica whose swap
    failed still answers with its old version (:func:`components.serving.batch_calls.load_new`)."""
    return replica_answers(deployment, "serving_artifact", app_name, calls_per_replica)


def swapped_deployments(config: dict[str, Any]) -> list[str]:
    """What :func:`swap_artifact` moves: the Retriever, and the Detector unless args pin one."""
    pinned_detector = config["applications"][0]["args"].get("detector_artifact")
    return ["Retriever"] if pinned_detector else ["Retriever", "Detector"]


def asked(deployment: str, method: str, app_name: str) -> set[str]:
    """:func:`replica_answers`, with a replica that does not answer (stuck in a model call) said as
    a :class:`SwapFailed` before anything is deployed.

    Raises:
        SwapFailed: a call timed out; nothing was changed.
    """
    try:
        return replica_answers(deployment, method, app_name)
    except TimeoutError as e:
        raise SwapFailed(f"{e}: a replica is stuck; nothing was swapped") from e


def retriever_config(config: dict[str, Any]) -> dict[str, Any]:
    """The Retriever's user config in the first application of ``config`` (empty if it has none)."""
    deployments = config["applications"][0].get("deployments") or []
    return next((d.get("user_config") or {} for d in deployments if d["name"] == "Retriever"), {})


def superseded(config: dict[str, Any], app_name: str = APP_NAME) -> bool:
    """Whether the app now runs a Retriever config other than ``config``'s: another driver deployed
    after this one. Undoing "this swap" would then undo theirs."""
    return retriever_config(running_config(app_name)) != retriever_config(config)


def follow_model(model_uri: str, app_name: str = APP_NAME, timeout_s: float = 180.0) -> str:
    """Hot-swap the running app to the version ``model_uri`` names now (e.g. after a promotion).

    The URI (``models:/<name>@champion``) is pinned on this driver to that version's directory,
    and only the deployments' user configs change, so replicas reconfigure in place with no
    dropped request (as :func:`swap_artifact` explains). Returns the pinned directory.

    A version that passes the driver's checks can still fail to load in the replicas (a partial
    copy, no detection threshold calibrated for it) or not be healthy in time. The replicas of each
    deployment it moved (:func:`swapped_deployments`) are asked what they serve; if one did not
    take it, the app is pinned again to what it served before (if one version), and
    :class:`SwapFailed` is raised.

    With another follower at work: if the URI names another version once this swap is in (the
    alias moved after it was read here, and the other follower's swap came first), that version is
    followed too; if another deploy replaced this one before its replicas were asked, it is left
    in place (its driver checks its replicas), and this follow succeeds only if that deploy pinned
    what the URI names now.
    """
    for _ in range(FOLLOW_ROUNDS):
        pinned = swap_once(model_uri, app_name, timeout_s)
        running = running_config(app_name)
        named = names_now(running, model_uri)
        if pinned is None:  # another deploy came after this one; its driver checks its replicas
            serves = retriever_config(running).get("artifact")
            if serves == named:
                return named
            raise SwapFailed(
                f"{model_uri}: another deploy replaced this swap before it was confirmed; the app "
                f"serves {serves}, and {model_uri} names {named}: left as that deploy put it"
            )
        if named == pinned:
            return pinned
    raise SwapFailed(f"{model_uri} named another version after each of {FOLLOW_ROUNDS} swaps")


def names_now(config: dict[str, Any], model_uri: str) -> str:
    """The directory ``model_uri`` names now, resolved as a swap pins it (through the app's registry
    settings), without building the deployments' user configs (which read the catalog again)."""
    from components.serving.app import pinned

    return pinned(model_uri, config["applications"][0]["args"].get("registry"))["artifact"]


def swap_once(model_uri: str, app_name: str, timeout_s: float) -> str | None:
    """One swap of :func:`follow_model`: the pinned directory, or None when another driver's deploy
    replaced it before its replicas could be asked (nothing is undone then).

    Raises:
        SwapFailed: the replicas did not take it; the app is back on what it served before.
    """
    running, before, config, base = prepared(model_uri, app_name)
    names = swapped_deployments(running)
    pinned = retriever_config(config)["artifact"]
    try:
        deploy_config(config, timeout_s, others=False, base=base)
        serving = {name: serving_artifacts(app_name, deployment=name) for name in names}
        refused = {name: sorted(artifacts) for name, artifacts in serving.items() if artifacts != {pinned}}
    except ValueError:
        raise  # refused by deploy_config's checks on this driver: nothing was deployed
    except TimeoutError as e:  # not healthy in time: the same way back
        # Replicas loading a large model (or calibrating one this driver could not: on a node
        # where the version sits in another directory) can take longer than the swap waits.
        hint = "if replicas calibrate it, calibrate first (serve --calibrate-only) or wait longer"
        refused = {"app": [f"TimeoutError: {e}; {hint}"]}
    except Exception as e:  # unhealthy (RuntimeError), a replica that died while asked (RayActorError)
        # Whatever it is, the new config is live: left there, the deployments could serve two
        # versions (the Retriever the old one, the Detector the new).
        refused = {"app": [f"{type(e).__name__}: {e}"]}
    if not refused:
        return pinned
    if superseded(config, app_name):
        return None
    answers = "; ".join(f"{name} replicas answer with {artifacts}" for name, artifacts in refused.items())
    back = len(before) == 1  # one version served before: pin it again
    if back:  # given the usual time, whatever the swap had
        try:
            back_config = swap_artifact(running, next(iter(before)), base)
            deploy_config(back_config, max(timeout_s, 180.0), others=False, base=base)
        except Exception as e:  # the reason the swap failed must not be lost behind this one
            raise SwapFailed(
                f"{model_uri}: pinned {pinned}, but {answers} (see logs); putting {sorted(before)} "
                f"back failed too ({type(e).__name__}: {e}): check `serve status`"
            ) from e
    then = "serves again" if back else "keeps the new one (no one version to go back to); it served"
    raise SwapFailed(
        f"{model_uri}: pinned {pinned}, but {answers} (see logs); the app {then} {sorted(before)}"
    )


def prepared(model_uri: str, app_name: str) -> tuple[dict[str, Any], set[str], dict[str, Any], str | None]:
    """What a swap starts from: the running config, the versions its Retriever replicas serve
    (what a refused swap goes back to), the config pinning ``model_uri``, calibrated on this driver
    (:func:`calibrate_here`: before the deploy, not against its timeout, nor in every replica at
    once), and where the args' relative paths are read (:func:`replicas_dir`).

    A calibration can take minutes, and another driver may deploy meanwhile: a refused swap would
    then have gone back to what ran before theirs, undoing a swap they had reported done. So the
    running config is read again after it, and everything is read anew if it changed (the second
    calibration of the same version is read from the detector file).

    Raises:
        SwapFailed: the app was redeployed by someone else during each calibration.
    """
    for _ in range(FOLLOW_ROUNDS):
        running = running_config(app_name)
        before = asked("Retriever", "serving_version", app_name)  # as any node can load them
        base = replicas_dir(running, app_name)
        config = swap_artifact(running, model_uri, base)
        calibrate_here(config)
        if not superseded(running, app_name):
            return running, before, config, base
    raise SwapFailed(f"{model_uri}: the app was redeployed during each of {FOLLOW_ROUNDS} calibrations")


def refresh_catalog(app_name: str = APP_NAME, timeout_s: float = 180.0) -> str:
    """Make the running app's Retriever replicas read their catalog again, in place (no restart).

    For a corpus changed under a running server (``toolscout ingest mcp`` run again): the user
    configs are rebuilt, as :func:`swap_artifact` builds them, for the artifact a Retriever replica
    answers with now (asked, not read from the args: a ``models:/`` URI there may name another
    version by now), so only ``catalog_version`` changes and replicas reconfigure in place. They
    load their model again from the same directory too (a directory can be rewritten in place, so
    the same path is not taken for the same model): an LM artifact briefly holds two copies.
    Returns the catalog version now configured, once every Retriever replica answers with it.

    Raises:
        SwapFailed: a replica still serves another catalog (it could not read the new one, or read
            other content: a node with its own copy of the corpus); its log says why.
    """
    versions = asked("Retriever", "serving_version", app_name)
    if len(versions) != 1:
        # After a half-failed swap the replicas disagree: asking one, picked by chance, pinned the
        # whole app to its version (possibly the old one), under cover of a catalog refresh.
        raise SwapFailed(
            f"Retriever replicas serve {sorted(versions)}; follow one version first "
            "(toolscout registry promote|rollback --follow), then refresh the catalog"
        )
    running = running_config(app_name)
    base = replicas_dir(running, app_name)
    config = swap_artifact(running, next(iter(versions)), base)
    wanted = retriever_config(config)["catalog_version"]
    try:
        deploy_config(config, timeout_s, others=False, base=base)
    except (RuntimeError, TimeoutError) as e:  # said as what the CLI reports, not a traceback
        failure = f"{type(e).__name__}: {e}"
        raise SwapFailed(f"catalog {wanted}: deploying it failed ({failure}); see `serve status`") from e
    # The Selector reads it too (its calls' schemas): left on the old one, it calls retired tools.
    readers = ["Retriever", *(["Selector"] if has_selector(config) else [])]
    for name in readers:
        answered = replica_answers(name, "serving_catalog", app_name)
        if answered != {wanted}:
            raise SwapFailed(f"catalog {wanted}: {name} replicas answer with catalogs {sorted(answered)}")
    return wanted
