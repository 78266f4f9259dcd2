"""Serving a MassTool artifact: the Detector deployment answers with MassTool's own detection tower."""

from __future__ import annotations

import pytest
import requests
from conftest import TINY_ENCODER
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import deploy

from components import methods
from components.methods.base import RunSpec
from components.methods.masstool import MassToolMethod
from components.registry import promote
from workflows.train import fit_method


@pytest.fixture(scope="module")
def masstool_version(ray_session, dataset, serving_root) -> str:
    """A small MassTool (semantic + joint stages on Ray Train), trained before Serve takes CPUs."""
    method = MassToolMethod(
        encoder=TINY_ENCODER,
        semantic={"epochs": 2, "batch_size": 64, "lr": 3e-3},
        epochs=3,
        batch_size=64,
        lr=1e-2,
        encoder_lr=1e-3,
        detection_weight=5.0,
        dim=32,
        detection_hidden=16,
        neighbours=5,
    )
    run = RunSpec(
        name="serve-masstool", storage_path=str(serving_root / "store"), local_dir=str(serving_root / "ck")
    )
    fit_method(method, dataset, run)  # every stage, then index
    path = str(serving_root / "models" / "masstool" / "v0001")
    method.save(path)
    promote(path)
    return path


def test_masstool_artifact_serves_its_own_detector(masstool_version, serve_instance, serving_data, dataset):
    url = serve_instance
    # No detector_file: a method with detect() needs no calibrated threshold.
    deploy({"artifact": masstool_version, "catalog": serving_data})
    local = methods.load(masstool_version)
    n = 8
    queries = list(dataset.split_queries("test").values())[:n] + dataset.neg_split["test"][:n]
    decisions, probabilities = [], []
    for query in queries:
        r = requests.post(f"{url}/v1/select", json={"query": query, "top_k": 3}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model_version"] == "masstool/v0001"
        expected = local.detect({"q": query})["q"]
        # The probability is the detection tower's, computed in the replica from the same artifact.
        assert body["probability"] == pytest.approx(expected, abs=1e-4)
        assert body["needs_tool"] == (expected >= 0.5)
        decisions.append(body["needs_tool"])
        probabilities.append(body["probability"])
        if body["needs_tool"]:
            want = local.retrieve({"q": query}, 3)["q"]  # {tool id: score}, best first
            assert [t["id"] for t in body["tools"]] == list(want)
            assert [t["score"] for t in body["tools"]] == pytest.approx(list(want.values()), abs=1e-3)
        else:
            assert body["tools"] == []
    # Both paths ran (retrieval, and chit-chat stopped before it), and tool queries score higher.
    assert True in decisions and False in decisions, decisions
    assert sum(probabilities[:n]) > sum(probabilities[n:]), probabilities
