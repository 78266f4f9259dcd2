"""``toolscout serve``: calibrate the detector (if needed), optionally train the selector LM, start Serve.

The application's settings come from a Serve config file (``deploy/serve_config.yaml`` by default,
the same file ``serve run`` / ``serve deploy`` and the KubeRay ``RayService`` use): its first
application's ``args`` and ``deployments``, then the command's flags on top. Local Ray and the
HTTP proxy bind 127.0.0.1 unless the config or ``--host`` says otherwise.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config import apply_overrides, load_yaml
from components.registry import resolve

if TYPE_CHECKING:
    from components.training.spec import RunSpec

DEFAULT_SERVE_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "serve_config.yaml"


def read_serve_config(path: str | Path | None) -> dict[str, Any]:
    """A Serve config file (``{}`` when ``path`` is None and the default file is absent)."""
    if path is None:
        return load_yaml(DEFAULT_SERVE_CONFIG) if DEFAULT_SERVE_CONFIG.exists() else {}
    return load_yaml(path)


def app_args(serve_config: dict[str, Any], overrides: dict[str, Any], extra: list[str]) -> dict[str, Any]:
    """The first application's args and deployment options, then flags, then ``serve.*`` overrides."""
    apps = serve_config.get("applications") or [{}]
    args = copy.deepcopy(apps[0].get("args") or {})
    # The app's deployments list (what `serve run` applies) wins over args.deployments, by name.
    by_name = {d["name"]: d for d in [*(args.get("deployments") or []), *(apps[0].get("deployments") or [])]}
    args["deployments"] = copy.deepcopy(list(by_name.values()))
    args.update({k: v for k, v in overrides.items() if v is not None})
    serve_overrides = [o.split(".", 1)[1] for o in extra if o.startswith("serve.")]
    return apply_overrides(args, serve_overrides)


def prepare(args: dict[str, Any], data: str | None, splits: dict[str, Any] | None) -> dict[str, Any]:
    """Calibrate the score-threshold detector for the artifact when the detector file lacks it.

    Done here, in the driver, so replicas only read the file; returns the args with
    ``detector_file`` set.
    """
    from components.encoders.runtimes import effective_runtime
    from components.serving.calibration import find_calibration, has_detect
    from components.serving.models import DEFAULT_ENCODER_RUNTIME, calibrate_artifact

    args = dict(args)
    args.setdefault("detector_file", os.path.join("runs", "serving", "detector.json"))
    # Replicas calibrate a version followed later with the same splits as this driver: with the
    # defaults instead, a prepared directory written with other splits is refused there.
    if splits is not None:
        args.setdefault("splits", splits)
    # A registry URI is calibrated for the version it names now: the one the app will pin.
    artifact = resolve(args.get("detector_artifact") or args["artifact"], args.get("registry"))
    # What the replicas will run, if their CPUs are this one's ("auto" resolved on this machine; a
    # replica on another kind of CPU finds no threshold for its runtime and calibrates its own).
    runtime = effective_runtime(args.get("encoder_runtime") or DEFAULT_ENCODER_RUNTIME)
    found = find_calibration(args["detector_file"], artifact, runtime, args.get("lm_engine"))
    if found is not None or has_detect(artifact):
        return args
    if not data:
        raise ValueError(
            f"{artifact} has no detect() and {args['detector_file']} no threshold for it on encoder "
            f"runtime {runtime!r}: pass --data to calibrate one on its valid split"
        )
    detector = calibrate_artifact(
        artifact, data, args["detector_file"], splits, runtime, args.get("lm_engine"), args.get("lm_endpoint")
    )
    assert detector is not None
    print(
        f"calibrated {artifact}: threshold {detector.threshold:.4f}, "
        f"valid accuracy {detector.accuracy:.4f} -> {args['detector_file']}"
    )
    return args


def train_selector(
    args: dict[str, Any],
    data: str,
    out: str,
    splits: dict[str, Any] | None,
    run: RunSpec | None = None,
) -> dict[str, Any]:
    """Train the local selector LM (``args.selector_training``: lm, steps, ...) and select it.

    Args:
        run: The Ray Train run (workers, GPU, storage): ``toolscout serve`` passes its config's
            ``train`` section, as every training does; None trains on one CPU worker beside ``out``.
    """
    from components.data import open_dataset
    from components.serving.catalog import load_catalog
    from components.serving.selector_train import train_selector_lm

    settings = dict(args.pop("selector_training", None) or {})
    catalog = load_catalog(args["catalog"])
    report = train_selector_lm(open_dataset(data, splits), catalog, out, run=run, **settings)
    loss = f"{report['first_loss']:.3f} -> {report['last_loss']:.3f}"
    print(f"selector LM: loss {loss} in {report['seconds']:.0f}s")
    return {**args, "selector": lm_selector(args.get("selector"), out)}


def lm_selector(section: dict[str, Any] | None, model: str) -> dict[str, Any]:
    """The ``selector`` section that serves the local LM at ``model``: the section's deployment
    settings (``deadline_s``) kept, and its other keys too when it already named an ``lm`` backend
    (another backend's keys, an endpoint's ``url``, mean nothing to this one)."""
    section = dict(section or {})
    if section.get("backend") != "lm":
        section = {k: v for k, v in section.items() if k == "deadline_s"}
    return {**section, "backend": "lm", "model": model}


def deployable(args: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """The Serve config ``toolscout serve`` deploys: the app built from ``args`` (paths made
    absolute) in ``base``, the config file, less the file's ``user_config`` of the model deployments.

    A file's deployment ``user_config`` (how ``serve deploy`` hot-swaps) would win over the one the
    app builds from the args, so ``--model`` would be ignored while the responses named the old
    version: the args are what this command serves."""
    from components.serving.app import USER_CONFIG_DEPLOYMENTS
    from components.serving.deploy import serve_config

    base = copy.deepcopy(base or {})
    apps = base.get("applications") or [{}]
    for deployment in apps[0].get("deployments") or []:
        built = deployment.get("name") in USER_CONFIG_DEPLOYMENTS
        if built and deployment.pop("user_config", None) is not None:
            print(f"{deployment['name']}: the config file's user_config is replaced by the args' one")
    from components.serving.deploy_checks import absolute_args

    return serve_config(absolute_args(args), base)


def serve_options(base: dict[str, Any] | None, host: str, port: int) -> dict[str, Any]:
    """``serve.start``'s options from the config file's top level (as ``serve run`` applies them:
    proxy location, HTTP and gRPC options, logging), with ``host`` and ``port`` as given."""
    base = base or {}
    options = {k: base[k] for k in ("proxy_location", "grpc_options", "logging_config") if base.get(k)}
    return {**options, "http_options": {**(base.get("http_options") or {}), "host": host, "port": port}}


def run_server(
    args: dict[str, Any], host: str, port: int, base: dict[str, Any] | None = None, blocking: bool = True
) -> str:
    """Start Serve's proxy on ``host:port`` and deploy the graph from a Serve config (as ``serve run``
    does, so later redeploys with a new artifact reconfigure replicas in place); blocks until Ctrl-C."""
    from ray import serve

    from components.serving.deploy import deploy_config, ingress_urls

    serve.start(**serve_options(base, host, port))
    deploy_config(deployable(args, base))
    url = f"http://{host}:{port}"
    print(f"serving on {url} (OpenAPI: {url}/docs)")
    for direct in ingress_urls(host):
        # The same API one hop shorter; a replica's port lives as long as the replica.
        print(f"  direct ingress replica: {direct}")
    if blocking:
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            serve.shutdown()
    return url
