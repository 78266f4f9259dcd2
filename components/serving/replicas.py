"""Finding a deployment's replica actors and waiting for it to be healthy (fault drills, benchmarks).

Replicas are named actors in Serve's namespace, ``SERVE_REPLICA::<app>#<deployment>#<id>``; the
named-actor listing is Ray's public API and needs no dashboard.
"""

from __future__ import annotations

import time

import ray
from ray import serve
from ray.actor import ActorHandle

SERVE_NAMESPACE = "serve"


def replica_names(deployment: str, app: str = "toolscout") -> list[str]:
    """Names of the live replica actors of ``app``'s ``deployment``."""
    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == SERVE_NAMESPACE and a["name"].startswith(prefix)
    )


def replica_actor(name: str) -> ActorHandle:
    return ray.get_actor(name, namespace=SERVE_NAMESPACE)


def running_replicas(deployment: str, app: str = "toolscout") -> int:
    """Replicas Serve reports RUNNING for the deployment."""
    status = serve.status().applications.get(app)
    if status is None or deployment not in status.deployments:
        return 0
    return int(status.deployments[deployment].replica_states.get("RUNNING", 0))


def wait_for_replicas(deployment: str, count: int, timeout_s: float = 60.0, app: str = "toolscout") -> None:
    """Block until ``count`` replicas are RUNNING (e.g. after a kill, until Serve has replaced it)."""
    deadline = time.monotonic() + timeout_s
    # Names first: a replacement's name exists only once the controller has seen the old replica
    # die, so the status read after it cannot still count the dead one as RUNNING.
    while len(replica_names(deployment, app)) < count or running_replicas(deployment, app) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{app}/{deployment}: fewer than {count} running replicas after {timeout_s}s")
        time.sleep(0.2)


def replica_answers(
    deployment: str,
    method: str,
    app: str = "toolscout",
    calls_per_replica: int = 8,
    timeout_s: float = 60.0,
) -> set[str]:
    """What the running replicas of ``app``'s ``deployment`` answer to ``method`` (no arguments).

    Asked through the deployment handle, ``calls_per_replica`` times per running replica: Serve
    routes each call to one replica (the less loaded of two drawn), so with 8 calls a replica of two
    goes unasked with probability 2**-16.

    Raises:
        TimeoutError: a call was not answered within ``timeout_s``. A replica stuck in a model call
            on its event loop still passes health checks, and the driver (a hot-swap, a catalog
            refresh) waited for it for ever.
    """
    handle = serve.get_deployment_handle(deployment, app)
    calls = calls_per_replica * max(1, running_replicas(deployment, app))
    answers = set()
    for _ in range(calls):
        try:
            answers.add(getattr(handle, method).remote().result(timeout_s=timeout_s))
        except TimeoutError as e:
            raise TimeoutError(f"{app}/{deployment}.{method}: no answer within {timeout_s} s") from e
    return answers
