"""Deploying the app from a Serve config, the way ``serve run <file>`` and ``serve deploy`` do.

Serve versions the code of a config-deployed application by a hash of its import path, runtime
env and ``args``. A redeploy whose only change is a deployment's ``user_config`` (under
``deployments:`` in the file) is a lightweight update: the running replicas get ``reconfigure``
calls, with no restart and no dropped request. That is how a model version is hot-swapped
(:mod:`components.serving.swap`). Changing ``args``, or deploying with ``serve.run(app)`` from Python (a new
random code version on every call), restarts the replicas instead. Hence this module, for
``toolscout serve``, the tests and the benchmark: they deploy exactly what
``serve run deploy/serve_config.yaml`` / ``serve deploy`` would.
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any

import ray
from ray import serve
from ray.serve.context import _get_global_client
from ray.serve.schema import ServeDeploySchema

from components.serving.deploy_checks import IMPORT_PATH, check_config

APP_NAME = "toolscout"


# Ray Serve's own latency knobs (see ray/serve/_private/constants.py): user code runs on the
# replica's event loop instead of a separate thread, routers on the caller's loop, request logs are
# buffered, deployments talk over gRPC, and the ingress replica serves HTTP itself on a port of its
# own (direct ingress, bound to ``http_options``' host, 127.0.0.1 by default) beside the proxy's,
# which saves the proxy -> ingress hop. On 2 cores BM25 detect -> retrieve at 8 clients did 2.6 to
# 3.1 times the proxy's req/s through that port, in the same runs (README, "Load and faults"); the
# proxy's port keeps working as the one stable address. :func:`ingress_urls` lists the direct ports.
# A stopping ingress replica keeps its port open for a minimum draining period so that a load
# balancer in front can deregister it; Ray's default is 30 s, which made every local shutdown and
# every redeploy that restarts the ingress wait that long (``serve.shutdown`` gave up at 30 s and
# killed the controller). Locally nothing sits in front, so 0.5 s (at 2 s this wait was 2 s of every
# 3.1 s app delete in the tests); in-flight requests are still drained. Cluster configs keep 30 s.
# Ray's metrics collection (``RAY_enable_metrics_collection``, a Ray core setting) is off for a local
# Serve: every replica records per-request Prometheus metrics and pushes them to the node's agent,
# all on the same few cores as the requests. On 2 cores, BM25 detect -> retrieve paced at 120 and
# 150 req/s had a median p99 of 17.9 and 23.1 ms without it against 38.2 and 35.6 ms with it
# (benchmarks/serve_env_ab.py: 24 paced runs of 10 s per variant, each in its own Ray). Serve's
# autoscaling does not use these metrics (handles report queue lengths to the controller), which
# tests/serving/test_live_updates.py checks. Export RAY_enable_metrics_collection=1 to keep
# Prometheus metrics; clusters keep them (their nodes start Ray themselves).
METRICS_COLLECTION = "RAY_enable_metrics_collection"  # Ray core's settings keep their case after RAY_
SERVE_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0.5",
    METRICS_COLLECTION: "0",
}


def apply_serve_env() -> dict[str, str]:
    """Set :data:`SERVE_ENV` where the environment does not already choose, before Ray starts.

    Serve reads these at import in every process (proxy, controller, replicas), and a local Ray's
    processes inherit this process's environment; on a cluster set them where ``ray start`` runs
    (``ray_cluster.yaml``, ``deploy/rayservice.yaml``). Returns the values in effect.
    """
    for key, value in SERVE_ENV.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in SERVE_ENV}


def serve_config(
    args: dict[str, Any], base: dict[str, Any] | None = None, app_name: str = APP_NAME
) -> dict[str, Any]:
    """A Serve config for the toolscout app with ``args``, keeping the rest of ``base`` (a config file):
    its other applications (e.g. the LLM app of :mod:`components.serving.llm_app`) stay as written."""
    config = copy.deepcopy(base or {})
    apps = config.get("applications") or [{}]
    app = {**apps[0], "name": app_name, "route_prefix": "/", "import_path": IMPORT_PATH, "args": args}
    config["applications"] = [app, *apps[1:]]
    return config


def deploy_config(
    config: dict[str, Any], timeout_s: float | None = None, others: bool = True, base: str | None = None
) -> None:
    """Apply ``config`` to the running Serve instance and wait until its applications are RUNNING.

    Serve must be started (``serve.start``) on this Ray cluster first. ``timeout_s`` defaults to
    180 s, or 900 s when the config has an LLM app (vLLM's start took 95-150 s on 2 CPU cores).
    ``others=False`` waits for the first application only: for a swap, which changes nothing in
    the others. Serve redeploys every application a config names, so an unchanged LLM app that was
    UNHEALTHY before is UNHEALTHY again, and failed the swap, which was then undone. ``base``: where
    the args' relative paths are checked (the replicas' working directory, for a swap).

    Raises:
        ValueError: the args or an artifact are bad (see :func:`check_config`); nothing was deployed.
        RuntimeError: an application waited for failed to deploy or is unhealthy.
        TimeoutError: not all of them RUNNING in time.
    """
    check_config(config, base)
    if timeout_s is None:
        from components.serving.llm_app import LLM_IMPORT_PATH

        paths = [app.get("import_path") for app in config["applications"]]
        timeout_s = 900.0 if LLM_IMPORT_PATH in paths else 180.0
    schema = ServeDeploySchema.model_validate(config)
    name = schema.applications[0].name
    previous = serve.status().applications.get(name)
    before = previous.last_deployed_time_s if previous else -1.0
    _get_global_client().deploy_apps(schema)  # what `serve run <file>` calls
    deadline = time.monotonic() + timeout_s
    watched = [app.name for app in (schema.applications if others else schema.applications[:1])]
    while True:
        apps = serve.status().applications
        status = apps.get(name)
        for app in watched:
            if app in apps and apps[app].status in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise RuntimeError(f"deploying {app!r} failed: {apps[app].message}")
        rest = [apps.get(app) for app in watched[1:]]
        if (
            status
            and status.last_deployed_time_s > before
            and status.status == "RUNNING"
            and all(other and other.status == "RUNNING" for other in rest)
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name!r} not RUNNING after {timeout_s}s: {status}")
        time.sleep(0.2)


def ingress_urls(host: str, app_name: str = APP_NAME) -> list[str]:
    """HTTP base URLs of ``app_name``'s running ingress replicas under direct ingress, one each.

    Each ingress replica listens on its own port (30000-31000 by default) and answers the same API
    as the proxy without the proxy's hop. The list is a snapshot: autoscaling adds and removes
    replicas, so a client that wants every replica (or a load balancer) asks again; the proxy's
    port always routes to whichever replicas exist. Empty when direct ingress is off or Serve runs
    no application of that name.

    Args:
        host: The address clients use. Replicas bind ``http_options``' host, so with a loopback
            host that is the address to dial; with ``0.0.0.0`` each replica's node IP is used.
    """
    from ray.serve._private.common import REPLICA_ID_FULL_ID_STR_PREFIX

    if app_name not in serve.status().applications:
        return []  # the controller raises KeyError for an app it does not know
    groups = ray.get(_get_global_client()._controller.get_target_groups.remote(app_name))
    wildcard = host in ("0.0.0.0", "::", "")
    # Without direct ingress, or before a replica runs, the groups name the proxies instead.
    return [
        f"http://{target.ip if wildcard else host}:{target.port}"
        for group in groups
        if group.app_name == app_name and group.protocol == "HTTP"
        for target in group.targets
        if target.name.startswith(REPLICA_ID_FULL_ID_STR_PREFIX)
    ]
