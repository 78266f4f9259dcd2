"""Serving a MassTool artifact: the Detector deployment answers with MassTool's own detection tower."""

from __future__ import annotations

import json
import shutil

import pytest
import requests
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import deploy

from components.serving.models import DEFAULT_ENCODER_RUNTIME, load_method


@pytest.fixture(scope="module")
def masstool_version(trained_masstool, serving_root) -> str:
    """The session's MassTool (trained on Ray Train through every stage, tests/conftest.py), saved
    as an artifact version."""
    path = str(serving_root / "models" / "masstool" / "v0001")
    trained_masstool[0].save(path)
    return path


def test_masstool_artifact_serves_its_own_detector(
    masstool_version, serve_instance, with_negatives_dir, with_negatives
):
    url, dataset = serve_instance, with_negatives
    # No detector_file: a method with detect() needs no calibrated threshold.
    deploy({"artifact": masstool_version, "catalog": str(with_negatives_dir)})
    # The same artifact on the encoder runtime the replicas serve on (bf16 moves a probability
    # by ~1e-4 against PyTorch fp32).
    local = load_method(masstool_version, DEFAULT_ENCODER_RUNTIME)
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
    # The served decisions are right for most of the 8 tool and 8 chit-chat queries (both paths
    # ran: retrieval, and chit-chat stopped before it), and tool queries score higher.
    labels = [True] * n + [False] * n
    correct = sum(d == y for d, y in zip(decisions, labels, strict=True))
    assert correct >= 12 and any(decisions[:n]) and not all(decisions[n:]), decisions
    assert sum(probabilities[:n]) > sum(probabilities[n:]), probabilities


def test_the_artifacts_own_detect_threshold_decides_unless_the_request_sets_one(
    masstool_version, serve_instance, with_negatives_dir, with_negatives, tmp_path
):
    dataset = with_negatives
    # The threshold evaluation reports detection at is the artifact's detect_threshold; serving
    # must decide with the same one. A copy with threshold 0 sends every query to retrieval.
    lenient = tmp_path / "masstool" / "v0002"
    shutil.copytree(masstool_version, lenient)
    config = json.loads((lenient / "config.json").read_text())
    (lenient / "config.json").write_text(json.dumps({**config, "detect_threshold": 0.0}))
    # Swapped in as a new version of the app the test above deployed (a user-config change: the
    # replicas reload in place instead of restarting).
    deploy({"artifact": masstool_version, "catalog": str(with_negatives_dir)}, artifact=str(lenient))
    chitchat = dataset.neg_split["test"][:4]
    for query in chitchat:
        request = {"query": query, "top_k": 3}
        body = requests.post(f"{serve_instance}/v1/select", json=request, timeout=60).json()
        assert body["needs_tool"] and len(body["tools"]) == 3, body
        assert body["versions"] == {"detector": "masstool/v0002", "retriever": "masstool/v0002"}
    # A request's own threshold still wins.
    strict = {"query": chitchat[0], "top_k": 3, "needs_tool_threshold": 1.0}
    body = requests.post(f"{serve_instance}/v1/select", json=strict, timeout=60).json()
    assert body["needs_tool"] is (body["probability"] >= 1.0)
