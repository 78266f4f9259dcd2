"""What a swap waits for and how long: the applications it watches, and replicas that do not answer.

Serve's controller and handles are stood in for here by objects that answer as Serve 2.60 does,
so that states a live cluster reaches only by chance (an unrelated app UNHEALTHY while a swap is
deployed, a replica stuck in a model call) are set up exactly; the swaps themselves run against a
live Serve in test_live_updates.py.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

import components.serving.deploy as deploy
import components.serving.replicas as replicas
from components.serving.swap import SwapFailed, asked


class Controller:
    """Serve's status and deploy calls for two applications: ``toolscout`` (RUNNING once deployed)
    and ``llm``, UNHEALTHY before and after (its engine is down), as Serve reports it after a deploy
    that changed nothing in it: each application a config names gets the new deploy time."""

    def __init__(self) -> None:
        self.deployed = 0.0
        self.deploys = 0

    def status(self) -> SimpleNamespace:
        at = 1.0 + self.deployed
        apps = {
            "toolscout": SimpleNamespace(status="RUNNING", message="", last_deployed_time_s=at),
            "llm": SimpleNamespace(status="UNHEALTHY", message="engine died", last_deployed_time_s=at),
        }
        return SimpleNamespace(applications=apps)

    def deploy_apps(self, schema) -> None:
        self.deploys += 1
        self.deployed += 1.0


CONFIG = {
    "applications": [
        {"name": "toolscout", "route_prefix": "/", "import_path": "tests:toolscout_app"},
        {"name": "llm", "route_prefix": "/llm", "import_path": "tests:llm_app"},
    ]
}


@pytest.fixture
def controller(monkeypatch) -> Controller:
    fake = Controller()
    monkeypatch.setattr(deploy, "serve", fake)
    monkeypatch.setattr(deploy, "_get_global_client", lambda: fake)
    return fake


def test_a_swap_waits_for_its_own_app_not_for_an_unhealthy_neighbour(controller):
    # A swap changes only the toolscout app's user configs. Before, the LLM app's UNHEALTHY (which
    # the swap did not cause) failed it, and follow_model undid a swap its replicas had taken.
    deploy.deploy_config(CONFIG, timeout_s=5, others=False)
    assert controller.deploys == 1
    # A deploy of the whole config still fails on any of its applications.
    with pytest.raises(RuntimeError, match="deploying 'llm' failed: engine died"):
        deploy.deploy_config(CONFIG, timeout_s=5)


class StuckHandle:
    """A deployment handle whose replica is stuck in a model call on its event loop: it passes
    health checks and never answers."""

    def __getattr__(self, method: str) -> SimpleNamespace:
        def result(timeout_s: float | None = None) -> str:
            if timeout_s is None:
                threading.Event().wait(5)
                raise AssertionError(f"{method} was asked with no time bound: the driver waits for ever")
            raise TimeoutError(f"Timed out after {timeout_s}s")

        return SimpleNamespace(remote=lambda: SimpleNamespace(result=result))


def test_a_replica_that_does_not_answer_fails_the_swap_before_anything_is_deployed(monkeypatch):
    monkeypatch.setattr(replicas.serve, "get_deployment_handle", lambda deployment, app: StuckHandle())
    monkeypatch.setattr(replicas, "running_replicas", lambda deployment, app: 2)
    with pytest.raises(TimeoutError, match=r"toolscout/Retriever\.serving_version: no answer within 0\.1 s"):
        replicas.replica_answers("Retriever", "serving_version", timeout_s=0.1)
    # follow_model and refresh_catalog ask first: a stuck replica is a SwapFailed the CLI reports.
    with pytest.raises(SwapFailed, match="a replica is stuck; nothing was swapped"):
        asked("Retriever", "serving_version", "toolscout")
