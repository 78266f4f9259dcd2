"""Under load: hot-swapping the artifact version (even to another method), with the detector pinned
and not; a swap to a version that fails to load; the registry champion followed through promotions
and rollbacks; killing a replica (its replacement keeps the pinned champion); autoscaling."""

from __future__ import annotations

import itertools
import os
import shutil
import time

import pytest
import ray
import requests
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import Load, deploy, half_written, private_registry, rewrite_corpus

from components.serving.deploy import METRICS_COLLECTION, deploy_config, serve_config
from components.serving.replicas import replica_actor, replica_names, wait_for_replicas
from components.serving.swap import SwapFailed, follow_model, refresh_catalog, running_config, swap_artifact

V1, V2 = "bm25/v0001", "bm25/v0002"


@pytest.fixture(scope="module")
def dense_version(trained_dense, serving_root) -> str:
    """The session's dense bi-encoder (trained on Ray Train, tests/conftest.py), saved as a version
    of the serving catalog's tools (every generated quickstart has the same 100)."""
    path = str(serving_root / "models" / "dense" / "v0001")
    trained_dense[0].save(path)
    return path


@pytest.fixture(scope="module")
def live(dense_version, serve_instance, bm25_versions, serving_data, dataset):
    args = {
        "artifact": bm25_versions["default"],
        "detector_artifact": bm25_versions["default"],  # detection stays; retrieval is swapped
        "catalog": serving_data,
        "detector_file": bm25_versions["detector_file"],
    }
    bodies = [
        {"query": q, "top_k": 3, "needs_tool_threshold": 0.0} for q in dataset.split_queries("test").values()
    ]
    return serve_instance, args, bodies[:50]


def test_hot_swap_under_load_changes_versions_in_place(live, bm25_versions, dense_version):
    url, args, bodies = live
    deploy(args)
    before = replica_names("Retriever")
    with Load(url, bodies, threads=2) as load:
        load.wait_for(lambda s: s.ok >= 20)
        deploy(args, artifact=bm25_versions["lucene"])
        load.wait_for(lambda s: s.versions and s.versions[-1] == "bm25/v0002")
        deploy(args, artifact=dense_version)  # another method, same deployment
        load.wait_for(lambda s: s.versions and s.versions[-1] == "dense/v0001")
        load.wait_for(lambda s: s.versions[-10:] == ["dense/v0001"] * 10)
    assert load.failures == []
    seen = list(dict.fromkeys(load.versions))
    assert seen == ["bm25/v0001", "bm25/v0002", "dense/v0001"]
    # The pinned detector never moved, while the retriever's version changed under it.
    assert {v["detector"] for _, v in load.answers} == {V1}
    assert all(model == v["retriever"] for model, v in load.answers)
    assert replica_names("Retriever") == before  # reconfigured, not restarted


def wait_for_replacement(deployment: str, victim: str, timeout_s: float = 60.0) -> None:
    """Block until a replica other than ``victim`` serves ``deployment``."""
    deadline = time.monotonic() + timeout_s
    while victim in replica_names(deployment) or not replica_names(deployment):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{deployment}: {victim} not replaced after {timeout_s}s")
        time.sleep(0.2)
    wait_for_replicas(deployment, 1, timeout_s)


def select(url: str, body: dict) -> dict:
    r = requests.post(f"{url}/v1/select", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_hot_swap_without_a_pinned_detector_names_both_versions(live, bm25_versions, dataset):
    url, args, bodies = live
    unpinned = {k: v for k, v in args.items() if k != "detector_artifact"}  # both deployments swap
    deploy(unpinned)
    with Load(url, bodies, threads=2) as load:
        load.wait_for(lambda s: s.ok >= 20)
        deploy(unpinned, artifact=bm25_versions["lucene"])
        load.wait_for(lambda s: s.answers[-10:] == [(V2, {"detector": V2, "retriever": V2})] * 10)
    assert load.failures == []
    assert load.answers[0] == (V1, {"detector": V1, "retriever": V1})
    # Each deployment reconfigures on its own: every answer names what actually ran, and
    # model_version stays the retriever's.
    for model, versions in load.answers:
        assert model == versions["retriever"] and {versions["detector"], versions["retriever"]} <= {V1, V2}
    # No tool needed (threshold 1.0): only the detector answered.
    body = select(url, {"query": dataset.neg_split["test"][0], "needs_tool_threshold": 1.0})
    assert body["needs_tool"] is False and body["versions"] == {"detector": V2, "retriever": None}
    assert body["model_version"] == V2


def test_a_swap_to_a_version_that_fails_to_load_keeps_serving(live, serving_root):
    url, args, bodies = live
    unpinned = {k: v for k, v in args.items() if k != "detector_artifact"}
    deploy(unpinned)  # the same args as the swap below: a change of args would restart the replicas
    broken = half_written(serving_root / "broken", "v0099")  # config.json present, index missing
    try:
        with Load(url, bodies, threads=2) as load:
            load.wait_for(lambda s: s.ok >= 10)
            # The driver's check passes (a config naming a known method); both replicas fail to load
            # it, log it, and keep the version they serve instead of going down.
            deploy_config(swap_artifact(serve_config(unpinned), broken))
            served = load.ok
            load.wait_for(lambda s: s.ok >= served + 20)
        assert load.failures == []
        assert set(load.versions) == {V1} and {v["detector"] for _, v in load.answers} == {V1}
        assert select(url, bodies[0])["versions"] == {"detector": V1, "retriever": V1}
    finally:
        shutil.rmtree(broken)
    # A missing artifact never reaches the replicas: the driver refuses it.
    with pytest.raises(ValueError, match="is not a directory"):
        swap_artifact(serve_config(unpinned), broken)


def test_killing_a_replica_under_load_fails_no_request_and_its_replacement_keeps_the_pinned_champion(
    live, bm25_versions, serving_root
):
    url, args, bodies = live
    registry = private_registry(bm25_versions, serving_root / "pinned")  # alias moves leak nowhere
    pinned = {**args, "artifact": "models:/bm25@champion", "registry": registry.settings.as_config()}
    # Serve notices a dead replica at its next health check: every 10 s by default, 0.5 s here, so
    # the replacement starts at once instead of up to 10 s after the kill.
    options = {
        "name": "Retriever",
        "num_replicas": 2,
        "health_check_period_s": 0.5,
        "ray_actor_options": {"num_cpus": 0.25},
    }
    deploy({**pinned, "deployments": [options]})
    wait_for_replicas("Retriever", 2)
    assert select(url, bodies[0])["versions"]["retriever"] == "bm25/v2"
    victim = replica_names("Retriever")[0]
    with Load(url, bodies, threads=2) as load:
        load.wait_for(lambda s: s.ok >= 20)
        registry.rollback("bm25")  # the champion moves to v1; serving has not followed yet
        ray.kill(replica_actor(victim), no_restart=True)
        # The load runs on while one replica is dead and its replacement starts.
        wait_for_replacement("Retriever", victim)
        wait_for_replicas("Retriever", 2)  # Serve replaced it
        served_after = load.ok
        load.wait_for(lambda s: s.ok >= served_after + 20)
    assert load.failures == []
    assert victim not in replica_names("Retriever")
    # The replacement loaded the version its deployment was given, not what the alias says now.
    assert set(load.versions) == {"bm25/v2"}
    assert {select(url, body)["versions"]["retriever"] for body in bodies[:10]} == {"bm25/v2"}


@pytest.fixture(scope="module")
def follow_registry(bm25_versions, serving_root):
    """The registry the following tests' app resolves ``models:/bm25@champion`` in: one for both, so
    that both deploy the same args and the second reconfigures the replicas instead of restarting them."""
    return private_registry(bm25_versions, serving_root / "follow")


def test_serving_follows_promotions_and_rollbacks_under_load(live, follow_registry):
    url, args, bodies = live
    registry = follow_registry
    followed = {**args, "artifact": "models:/bm25@champion", "registry": registry.settings.as_config()}
    deploy(followed)
    with Load(url, bodies, threads=2) as load:
        load.wait_for(lambda s: s.ok >= 20)
        registry.rollback("bm25")  # champion v2 -> v1 (v2 becomes previous)
        assert follow_model("models:/bm25@champion").endswith("/bm25/v1")
        load.wait_for(lambda s: s.versions[-10:] == ["bm25/v1"] * 10)
        registry.promote("bm25", 2)  # a promotion (as the retrain gate makes one): champion v2
        follow_model("models:/bm25@champion")
        load.wait_for(lambda s: s.versions[-10:] == ["bm25/v2"] * 10)
    assert load.failures == []
    assert [v for v, _ in itertools.groupby(load.versions)] == ["bm25/v2", "bm25/v1", "bm25/v2"]
    # A catalog refresh rebuilds the configs for what replicas serve: the registry version, so a
    # replica started later on a node without its directory can still fetch it (not the bare dir).
    refresh_catalog()
    (app,) = [a for a in running_config()["applications"] if a["name"] == "toolscout"]
    retriever = next(d for d in app["deployments"] if d["name"] == "Retriever")
    assert retriever["user_config"]["source"] == "models:/bm25/2"


def test_two_followers_at_once_end_on_the_champion_and_neither_undoes_the_other(
    live, follow_registry, bm25_versions, monkeypatch
):
    # A retrain round's --follow and an operator's rollback --follow, run at once: the other
    # driver's moves are made at the points where they hurt, through the real registry and Serve.
    import components.serving.swap as swap

    url, args, bodies = live
    probe, registry = bodies[0], follow_registry
    followed = {**args, "artifact": "models:/bm25@champion", "registry": registry.settings.as_config()}
    deploy(followed)  # serving v2, as built (the first champion)
    v3 = registry.log_version("bm25", bm25_versions["default"])  # v1's files as a new version
    real = swap.deploy_config
    moves = []

    def other_follower_after(config, *a, **kw):
        real(config, *a, **kw)  # this follower's swap is in ...
        if not moves:  # ... when the other promotes v3 and follows it before it can check
            moves.append(registry.promote("bm25", v3.number))
            real(swap.swap_artifact(running_config(), "models:/bm25@champion"), others=False)

    registry.promote("bm25", 1)  # champion v1: this follower reads it ...
    monkeypatch.setattr(swap, "deploy_config", other_follower_after)
    # Before, it found v3 where it had put v1, "undid" its swap to v2, and raised: serving ended on
    # neither champion. Now the other deploy stands, and it names what the alias names.
    assert follow_model("models:/bm25@champion").endswith(f"/bm25/v{v3.number}")
    assert select(url, probe)["versions"]["retriever"] == f"bm25/v{v3.number}"

    moves.clear()

    def other_follower_before(config, *a, **kw):
        if not moves:  # the other promotes v2 and follows it before this follower's stale swap lands
            moves.append(registry.promote("bm25", 2))
            real(swap.swap_artifact(running_config(), "models:/bm25@champion"), others=False)
        real(config, *a, **kw)

    registry.promote("bm25", 1)  # champion v1 again: this follower reads it
    monkeypatch.setattr(swap, "deploy_config", other_follower_before)
    # Before, it returned v1 and left serving on it while the champion was v2.
    assert follow_model("models:/bm25@champion").endswith("/bm25/v2")
    assert select(url, probe)["versions"]["retriever"] == "bm25/v2"


def test_a_catalog_changed_under_load_is_reloaded_in_place_and_its_retired_tool_never_served(
    live, serving_data, tmp_path
):
    url, args, bodies = live
    data = tmp_path / "catalog"
    shutil.copytree(serving_data, data)  # this test's own copy, changed below
    private = {**args, "catalog": str(data)}
    deploy(private)
    probe = {**bodies[0], "top_k": 3}
    top = [t["id"] for t in select(url, probe)["tools"]]
    old = requests.get(f"{url}/v1/tools", timeout=30).json()
    old_version = old["catalog_version"]
    before = replica_names("Retriever")
    with Load(url, bodies, threads=2) as load:
        load.wait_for(lambda s: s.ok >= 10)
        rewrite_corpus(data, drop=top[0], rename=top[1])  # as `toolscout ingest mcp` re-run would
        new_version = refresh_catalog()
        served = load.ok
        load.wait_for(lambda s: s.ok >= served + 10)
    assert load.failures == [] and new_version != old_version
    assert replica_names("Retriever") == before  # reconfigured in place, no restart
    info = requests.get(f"{url}/v1/tools", timeout=30).json()
    assert info["catalog_version"] == new_version and info["size"] == old["size"] - 1  # one retired
    after = select(url, probe)["tools"]
    assert [t["id"] for t in after] == [*top[1:], after[2]["id"]] and top[0] not in {t["id"] for t in after}
    assert "renamed_" in after[0]["name"]


def test_autoscaling_adds_a_retriever_replica_under_load(live):
    # Serve's autoscaling runs on queue lengths the handles report to the controller, not on Ray's
    # metrics, which the serving env turns off (components/serving/deploy.py): with them off, load
    # must still bring a second replica, and no request may fail while it starts.
    assert os.environ.get(METRICS_COLLECTION) == "0"
    url, args, bodies = live
    autoscaling = {
        "min_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 0.1,  # any steady traffic asks for the second replica
        "metrics_interval_s": 0.5,
        "look_back_period_s": 2.0,
        "upscale_delay_s": 0.5,
        "downscale_delay_s": 600.0,  # no scale-down while the test looks
        # A changed config starts from one replica, whatever an earlier test left running (without
        # initial_replicas Serve would keep the current count).
        "initial_replicas": 1,
    }
    options = {
        "name": "Retriever",
        "autoscaling_config": autoscaling,
        "ray_actor_options": {"num_cpus": 0.25},
    }
    # deploy() returns once the application is RUNNING on the autoscaling config: with no load
    # yet, it runs the one replica it starts from (the scale-up below is the load's doing). The
    # replicas of the previous config may still be stopping then.
    deploy({**args, "deployments": [options]})
    deadline = time.monotonic() + 60
    while len(replica_names("Retriever")) != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(replica_names("Retriever")) == 1
    with Load(url, bodies, threads=4, max_seconds=90) as load:
        load.wait_for(lambda s: s.ok >= 20)
        wait_for_replicas("Retriever", 2, timeout_s=60)
        served = load.ok
        load.wait_for(lambda s: s.ok >= served + 20)
    assert load.failures == []
    assert len(replica_names("Retriever")) == 2


def test_following_a_version_the_replicas_cannot_load_is_reported_and_undone(
    live, bm25_versions, serving_root
):
    url, args, bodies = live
    registry = private_registry(bm25_versions, serving_root / "unloadable")
    unpinned = {k: v for k, v in args.items() if k != "detector_artifact"}  # the detector follows too
    followed = {**unpinned, "artifact": "models:/bm25@champion", "registry": registry.settings.as_config()}
    deploy(followed)
    v2 = {"detector": "bm25/v2", "retriever": "bm25/v2"}
    assert select(url, bodies[0])["versions"] == v2

    def pinned_back_to_v2() -> None:
        # Still serving v2, and pinned to it again: a replica started now would not try the bad one.
        assert all(select(url, body)["versions"] == v2 for body in bodies[:10])
        (app,) = [a for a in running_config()["applications"] if a["name"] == "toolscout"]
        pinned = {d["name"]: d["user_config"]["artifact"] for d in app["deployments"]}
        assert pinned["Retriever"].endswith("/bm25/v2") and pinned["Detector"].endswith("/bm25/v2")
        # As the registry version it is, which any node can fetch (not a directory only this has).
        assert {d["user_config"].get("source") for d in app["deployments"]} == {"models:/bm25/2"}

    # A version that passes the driver's checks (its config.json names a method) and that no
    # replica can load: its index is missing.
    broken = registry.log_version("bm25", half_written(serving_root / "unloadable" / "files", "v0003"))
    registry.promote("bm25", broken.number)
    with pytest.raises(SwapFailed, match=r"Retriever replicas answer with .*bm25/v2"):
        follow_model("models:/bm25@champion")
    pinned_back_to_v2()
    # A whole BM25 version the Retriever loads, but with no detection threshold calibrated for it
    # in the detector file (and no calibration data to fit one): only the Detector refuses it.
    # Before, the swap was confirmed on the Retriever alone and answers mixed v4 with v2.
    uncalibrated = registry.log_version("bm25", bm25_versions["lucene"])
    registry.promote("bm25", uncalibrated.number)
    with pytest.raises(SwapFailed) as refused:
        follow_model("models:/bm25@champion")
    said = str(refused.value)
    assert "Detector replicas answer with" in said and "Retriever replicas" not in said
    pinned_back_to_v2()
    # A version not healthy in time (replicas still loading or calibrating it): undone the same way,
    # not left half-swapped behind a TimeoutError.
    good = registry.log_version("bm25", bm25_versions["default"])
    registry.promote("bm25", good.number)
    with pytest.raises(SwapFailed, match=r"TimeoutError: .*calibrate first \(serve --calibrate-only\)"):
        follow_model("models:/bm25@champion", timeout_s=0.001)
    pinned_back_to_v2()
