"""A refused swap's way back: what it goes back to, on which errors, and when that fails too.

Serve is stood in for by :class:`FakeApp`: a config deployed is the running config, and each
replica takes a deployment's new artifact unless it is told to refuse it (as ``load_new`` keeps
the old version). The states these tests need (another driver deploying in the middle of a swap,
a replica dying while asked, a rollback that cannot deploy) are reached on a live cluster only by
chance; the swaps themselves run against a live Serve in test_live_updates.py.
"""

from __future__ import annotations

import copy

import pytest
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)

import components.serving.swap as swap


def app_config(artifact: str) -> dict:
    deployments = [{"name": n, "user_config": {"artifact": artifact}} for n in ("Retriever", "Detector")]
    return {"applications": [{"name": "toolscout", "args": {}, "deployments": deployments}]}


class ReplicaDied(Exception):
    """What Ray raises when a replica's process dies during a call (not a RuntimeError)."""


class FakeApp:
    def __init__(self, artifact: str) -> None:
        self.config = app_config(artifact)
        self.serving = {"Retriever": {artifact}, "Detector": {artifact}}
        self.refuses: set[tuple[str, str]] = set()  # (deployment, artifact) its replicas cannot load
        self.deploy_errors: list[Exception | None] = []  # raised by successive deploys, after applying
        self.ask_error: Exception | None = None  # raised once by the next question after a deploy
        self.deployed: list[str] = []

    def running_config(self, app_name: str = "toolscout") -> dict:
        return copy.deepcopy(self.config)

    def deploy_config(
        self, config: dict, timeout_s: float | None = None, others: bool = True, base=None
    ) -> None:
        self.config = copy.deepcopy(config)
        for d in config["applications"][0]["deployments"]:
            artifact = d["user_config"]["artifact"]
            if (d["name"], artifact) not in self.refuses:
                self.serving[d["name"]] = {artifact}
        self.deployed.append(config["applications"][0]["deployments"][0]["user_config"]["artifact"])
        error = self.deploy_errors.pop(0) if self.deploy_errors else None
        if error is not None:
            raise error

    def answers(self, deployment: str, *args, **kwargs) -> set[str]:
        if self.ask_error is not None:
            error, self.ask_error = self.ask_error, None
            raise error
        return set(self.serving[deployment])

    def swap_artifact(self, config: dict, artifact: str, base: str | None = None) -> dict:
        config = copy.deepcopy(config)
        for d in config["applications"][0]["deployments"]:
            d["user_config"] = {"artifact": artifact}
        return config


@pytest.fixture
def app(monkeypatch) -> FakeApp:
    fake = FakeApp("/m/v1")
    monkeypatch.setattr(swap, "running_config", fake.running_config)
    monkeypatch.setattr(swap, "deploy_config", fake.deploy_config)
    monkeypatch.setattr(swap, "swap_artifact", fake.swap_artifact)
    monkeypatch.setattr(swap, "replica_answers", fake.answers)
    monkeypatch.setattr(swap, "serving_artifacts", lambda app_name, deployment: fake.answers(deployment))
    monkeypatch.setattr(swap, "calibrate_here", lambda config: None)
    return fake


def test_a_refused_swap_goes_back_to_what_another_driver_deployed_while_it_calibrated(app, monkeypatch):
    # Driver A's swap to v3 landed while this driver calibrated v2. v2 was then refused, and the
    # rollback put back v1, read before the calibration: A's finished swap was undone.
    app.refuses.add(("Detector", "/m/v2"))
    calibrations = []

    def calibrate(config):
        if not calibrations:  # the other driver's swap, done while this one calibrates
            app.deploy_config(app.swap_artifact(app.config, "/m/v3"))
        calibrations.append(config)

    monkeypatch.setattr(swap, "calibrate_here", calibrate)
    with pytest.raises(swap.SwapFailed, match=r"the app serves again \['/m/v3'\]"):
        swap.swap_once("/m/v2", "toolscout", 1.0)
    assert app.serving == {"Retriever": {"/m/v3"}, "Detector": {"/m/v3"}}
    assert len(calibrations) == 2  # calibrated again on what runs now


def test_a_replica_dying_while_asked_rolls_the_swap_back(app, monkeypatch):
    # Only TimeoutError and RuntimeError were caught: a replica lost mid-question left the new
    # config live with nothing undone, here the Detector on v2 and the Retriever on v1.
    app.refuses.add(("Retriever", "/m/v2"))

    def deploy_then_die(config, timeout_s=None, others=True, base=None):
        app.deploy_config(config, timeout_s, others)
        if app.deployed == ["/m/v2"]:
            app.ask_error = ReplicaDied("the actor died unexpectedly")

    monkeypatch.setattr(swap, "deploy_config", deploy_then_die)
    with pytest.raises(swap.SwapFailed, match=r"ReplicaDied: the actor died unexpectedly.*serves again"):
        swap.swap_once("/m/v2", "toolscout", 1.0)
    assert app.deployed == ["/m/v2", "/m/v1"]
    assert app.serving == {"Retriever": {"/m/v1"}, "Detector": {"/m/v1"}}


def test_a_rollback_that_fails_keeps_the_reason_the_swap_failed(app):
    # The rollback's RuntimeError replaced the SwapFailed naming the replicas that refused, and the
    # CLI printed a traceback.
    app.refuses.add(("Detector", "/m/v2"))
    app.deploy_errors = [None, RuntimeError("deploying 'toolscout' failed: replica died")]
    with pytest.raises(swap.SwapFailed) as failed:
        swap.swap_once("/m/v2", "toolscout", 1.0)
    said = str(failed.value)
    assert "Detector replicas answer with ['/m/v1']" in said
    assert "putting ['/m/v1'] back failed too (RuntimeError: deploying 'toolscout' failed" in said


def test_a_config_refused_on_the_driver_deploys_nothing_and_is_not_a_rollback(app, monkeypatch):
    def refuse(config, timeout_s=None, others=True, base=None):
        raise ValueError("application 'toolscout': bad args")  # deploy_config's checks, before Serve

    monkeypatch.setattr(swap, "deploy_config", refuse)
    with pytest.raises(ValueError, match="bad args"):
        swap.swap_once("/m/v2", "toolscout", 1.0)
    assert app.serving == {"Retriever": {"/m/v1"}, "Detector": {"/m/v1"}}


def test_a_catalog_refresh_that_cannot_deploy_is_a_swap_failure_the_cli_reports(app, monkeypatch):
    monkeypatch.setattr(swap, "swap_artifact", lambda config, artifact, base=None: config)
    monkeypatch.setattr(swap, "retriever_config", lambda config: {"catalog_version": "c2"})
    app.deploy_errors = [RuntimeError("deploying 'toolscout' failed: replica died")]
    with pytest.raises(swap.SwapFailed, match=r"catalog c2: deploying it failed \(RuntimeError: deploying"):
        swap.refresh_catalog()


def test_a_catalog_refresh_the_selector_did_not_take_is_a_swap_failure(app, monkeypatch):
    # Only the Retriever's replicas were asked: a Selector that could not read the new catalog kept
    # building calls from the old one (a renamed tool's old schema), and the refresh said it was done.
    app.config["applications"][0]["args"]["selector"] = {"backend": "openai"}
    monkeypatch.setattr(swap, "swap_artifact", lambda config, artifact, base=None: config)
    monkeypatch.setattr(swap, "retriever_config", lambda config: {"catalog_version": "c2"})
    catalogs = {"Retriever": {"c2"}, "Selector": {"c1"}}
    monkeypatch.setattr(swap, "replica_answers", lambda name, method, app_name: catalogs[name])
    monkeypatch.setattr(swap, "asked", lambda name, method, app_name: {"/m/v1"})
    with pytest.raises(swap.SwapFailed, match=r"catalog c2: Selector replicas answer with catalogs \['c1'\]"):
        swap.refresh_catalog()
    catalogs["Selector"] = {"c2"}
    assert swap.refresh_catalog() == "c2"
    del app.config["applications"][0]["args"]["selector"]  # no Selector: not asked
    del catalogs["Selector"]
    assert swap.refresh_catalog() == "c2"


def test_a_swap_reads_the_args_relative_paths_where_the_replicas_do(
    bm25_versions, serving_data, tmp_path, monkeypatch
):
    # An app deployed from a file with relative paths (deploy/rayservice.yaml) resolved them in its
    # replicas' working directory; a swap driver elsewhere (a submitted job's unpacked working_dir)
    # read them against its own, and found no catalog there, or another one.
    import shutil

    from components.serving.app import catalog_version
    from components.serving.deploy_checks import IMPORT_PATH, check_config

    site = tmp_path / "site"
    shutil.copytree(serving_data, site / "data")
    shutil.copytree(bm25_versions["default"], site / "model")
    shutil.copy(bm25_versions["detector_file"], site / "detector.json")
    args = {"artifact": "model", "catalog": "data", "detector_file": "detector.json"}
    running = {"applications": [{"name": "toolscout", "import_path": IMPORT_PATH, "args": args}]}
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    deployed = []

    def deploy(config, timeout_s=None, others=True, base=None):
        check_config(config, base)  # deploy_config's check, on this driver
        deployed.append(config)

    asked = {"working_dir": {str(site)}, "serving_version": {str(site / "model")}}
    monkeypatch.setattr(swap, "running_config", lambda app_name="toolscout": copy.deepcopy(running))
    monkeypatch.setattr(swap, "asked", lambda name, method, app_name: asked[method])
    monkeypatch.setattr(swap, "deploy_config", deploy)
    wanted = catalog_version(str(site / "data"))
    monkeypatch.setattr(swap, "replica_answers", lambda name, method, app_name: {wanted})
    assert swap.refresh_catalog() == wanted
    (config,) = deployed
    (app,) = config["applications"]
    assert app["args"] == args  # as deployed: changed args would restart the app
    made = {d["name"]: d["user_config"] for d in app["deployments"]}
    assert made["Retriever"]["artifact"] == str(site / "model")
    assert made["Detector"]["detector_file"] == str(site / "detector.json")
    with pytest.raises(ValueError, match="elsewhere/model is not a directory"):
        check_config(running)  # against this driver's directory: the error every swap hit
    asked["working_dir"] = {str(site), "/elsewhere"}  # replicas in two directories: no one base
    with pytest.raises(
        swap.SwapFailed, match=r"args \['artifact', 'catalog', 'detector_file'\] are relative"
    ):
        swap.refresh_catalog()
