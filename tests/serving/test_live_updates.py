"""Under load: hot-swapping the artifact version (even to another method) and killing a replica."""

from __future__ import annotations

import pytest
import ray
from conftest import TINY_ENCODER
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import Load, deploy

from components.methods.base import RunSpec
from components.methods.dense import DenseMethod
from components.registry import promote
from components.serving.replicas import replica_actor, replica_names, wait_for_replicas


@pytest.fixture(scope="module")
def dense_version(ray_session, dataset, serving_root) -> str:
    """A dense bi-encoder trained for one epoch on Ray Train (before Serve takes CPUs)."""
    method = DenseMethod(encoder=TINY_ENCODER, epochs=1, batch_size=64, lr=3e-3)
    run = RunSpec(
        name="serve-dense", storage_path=str(serving_root / "store"), local_dir=str(serving_root / "ck")
    )
    method.fit("contrastive", dataset, run)
    method.index(dataset.corpus)
    path = str(serving_root / "models" / "dense" / "v0001")
    method.save(path)
    promote(path)
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
    assert replica_names("Retriever") == before  # reconfigured, not restarted


def test_killing_a_retriever_replica_under_load_fails_no_request(live):
    url, args, bodies = live
    options = {"name": "Retriever", "num_replicas": 2, "ray_actor_options": {"num_cpus": 0.25}}
    deploy({**args, "deployments": [options]})
    wait_for_replicas("Retriever", 2)
    victim = replica_names("Retriever")[0]
    with Load(url, bodies, threads=2) as load:
        load.wait_for(lambda s: s.ok >= 20)
        served_before = load.ok
        ray.kill(replica_actor(victim), no_restart=True)
        load.wait_for(lambda s: s.ok >= served_before + 50)
        wait_for_replicas("Retriever", 2)  # Serve replaced it
        load.wait_for(lambda s: s.ok >= served_before + 80)
    assert load.failures == []
    assert victim not in replica_names("Retriever")
