"""Score-threshold detector: threshold search, logistic fit, per-artifact storage, detect() preference."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_fixtures import _data

from components.methods import REGISTRY
from components.methods.bm25.method import BM25Method
from components.registry import resolve
from components.serving import models, swap
from components.serving.calibration import (
    ScoreThreshold,
    artifact_key,
    best_threshold,
    calibrate,
    calibrate_scores,
    find_calibration,
    fit_logistic,
    model_version,
    save_calibration,
)
from components.serving.models import DetectorModel, ensure_calibration


def acc(tool: np.ndarray, no_tool: np.ndarray, t: float, balanced: bool) -> float:
    if balanced:
        return ((tool >= t).mean() + (no_tool < t).mean()) / 2
    return ((tool >= t).sum() + (no_tool < t).sum()) / (len(tool) + len(no_tool))


@pytest.mark.parametrize("balanced", [True, False])
def test_best_threshold_matches_brute_force(balanced):
    rng = np.random.default_rng(0)
    for _ in range(20):
        tool, no_tool = rng.normal(2, 1, 40).round(1), rng.normal(0, 1, 15).round(1)
        threshold, accuracy = best_threshold(tool, no_tool, balanced)
        points = np.unique(np.concatenate([tool, no_tool, [tool.min() - 1, tool.max() + 1]]))
        assert accuracy == pytest.approx(max(acc(tool, no_tool, t, balanced) for t in points))
        assert acc(tool, no_tool, threshold, balanced) == pytest.approx(accuracy)


def test_balanced_threshold_does_not_call_everything_a_tool():
    rng = np.random.default_rng(1)
    tool, no_tool = rng.normal(1.0, 1, 500), rng.normal(0.0, 1, 20)  # 25:1, overlapping classes
    plain, _ = best_threshold(tool, no_tool, balanced=False)
    fair, _ = best_threshold(tool, no_tool, balanced=True)
    assert (no_tool < fair).mean() > (no_tool < plain).mean() + 0.3


def test_logistic_fit_is_monotone_and_calibrated_on_separable_data():
    x = np.concatenate([np.linspace(-3, -0.5, 50), np.linspace(0.5, 3, 50)])
    y = (x > 0).astype(float)
    slope, intercept = fit_logistic(x, y)
    assert slope > 1.0 and abs(intercept) < 0.5
    p = 1 / (1 + np.exp(-(slope * x + intercept)))
    assert (p[y == 1] > 0.5).all() and (p[y == 0] < 0.5).all()


def test_calibration_separates_tool_from_chitchat(bm25_versions, dataset):
    v1 = bm25_versions["default"]
    stored = find_calibration(bm25_versions["detector_file"], v1, "torch")
    assert stored is not None and stored.accuracy > 0.7 and stored.balanced
    assert stored.n_tool == len(dataset.qrels["valid"]) and stored.n_no_tool == len(
        dataset.neg_split["valid"]
    )
    detector = DetectorModel(v1, bm25_versions["detector_file"])
    assert detector.kind == "score_threshold" and detector.version == "bm25/v0001"
    tool_q = list(dataset.split_queries("test").values())[:40]
    no_tool_q = dataset.neg_split["test"][:40]
    p_tool, p_none = detector.probabilities(tool_q), detector.probabilities(no_tool_q)
    assert np.mean(p_tool) > np.mean(p_none) + 0.2
    balanced = ((np.array(p_tool) >= 0.5).mean() + (np.array(p_none) < 0.5).mean()) / 2
    assert balanced > 0.65


def test_each_version_has_its_own_entry(bm25_versions):
    v1, v2 = bm25_versions["default"], bm25_versions["lucene"]
    assert artifact_key(v1) != artifact_key(v2)
    champion = resolve("models:/bm25@champion", bm25_versions["registry"])
    assert model_version(champion) == "bm25/v2"  # a registry version's dir names its version
    a, b = (
        find_calibration(bm25_versions["detector_file"], v1, "torch"),
        find_calibration(bm25_versions["detector_file"], v2, "torch"),
    )
    assert a is not None and b is not None and a != b


def test_a_threshold_is_kept_per_encoder_runtime_where_the_runtime_moves_the_scores(
    bm25_versions, duplicated_dense, tmp_path
):
    # A dense model's cosines move with its runtime (int8 ONNX by up to ~0.05): a threshold fitted
    # on one runtime's scores is not found for another, and a replica there refuses to guess.
    file = str(tmp_path / "d.json")
    dense = duplicated_dense["artifact"]
    fitted = ScoreThreshold(0.5, 1.0, 0.0, 1.0, 1, 1)
    save_calibration(file, dense, fitted, "onnx")
    assert find_calibration(file, dense, "onnx") == fitted
    assert (
        find_calibration(file, dense, "onnx-int8") is None and find_calibration(file, dense, "torch") is None
    )
    with pytest.raises(ValueError, match="no entry for it scored on encoder runtime 'torch'"):
        DetectorModel(dense, file, encoder_runtime="torch")
    # BM25 has no text encoder: its one threshold serves on every runtime.
    save_calibration(file, bm25_versions["default"], fitted, "torch")
    assert find_calibration(file, bm25_versions["default"], "onnx-int8") == fitted


def test_a_detector_file_from_before_runtime_keys_still_serves_bm25_only(
    bm25_versions, duplicated_dense, tmp_path
):
    # The older format keyed entries by artifact alone: BM25's scores never moved with a runtime,
    # so its entry holds; a dense entry was fitted on some runtime's cosines no one recorded.
    bm25, dense = bm25_versions["default"], duplicated_dense["artifact"]
    fitted = ScoreThreshold(0.5, 1.0, 0.0, 1.0, 1, 1)
    old = {k: {"artifact": k, "detector": asdict(fitted)} for k in (artifact_key(bm25), artifact_key(dense))}
    file = tmp_path / "old.json"
    file.write_text(json.dumps({"kind": "score_threshold", "calibrations": old}))
    assert find_calibration(str(file), bm25, "onnx") == fitted
    assert find_calibration(str(file), dense, "onnx") is None
    with pytest.raises(ValueError, match="predates calibrations kept per encoder runtime and LM engine"):
        DetectorModel(dense, str(file), encoder_runtime="torch")


def test_uncalibrated_artifact_without_data_is_a_clear_error(bm25_versions, tmp_path):
    with pytest.raises(ValueError, match="calibrate"):
        DetectorModel(bm25_versions["default"], str(tmp_path / "none.json"))


def test_calibrating_in_the_replica_writes_the_file(bm25_versions, serving_data, tmp_path):
    file = str(tmp_path / "d.json")
    detector = DetectorModel(bm25_versions["lucene"], file, calibration_data=serving_data)
    assert find_calibration(file, bm25_versions["lucene"], "torch") == detector.threshold


class _BM25WithDetect(BM25Method):
    """A method with its own detector (as MassTool has): detection by whether any term is known."""

    name = "bm25_detect"
    capabilities = frozenset({"cold_start", "detect"})
    detect_threshold = 0.5

    def detect(self, queries: dict[str, str]) -> dict[str, float]:
        top = {q: max(r.values(), default=0.0) for q, r in self.retrieve(queries, 1).items()}
        return {q: float(top.get(q, 0.0) > 0) for q in queries}

    def retrieve_detected(self, queries: dict[str, str], k: int):
        return self.retrieve(queries, k), self.detect(queries)


def test_method_detect_is_preferred_over_calibration(monkeypatch, dataset, tmp_path):
    monkeypatch.setitem(REGISTRY, _BM25WithDetect.name, f"{__name__}:_BM25WithDetect")
    method = _BM25WithDetect()
    method.index(dataset.corpus)
    method.save(str(tmp_path / "m" / "v0001"))  # config.json names "bm25_detect"
    detector = DetectorModel(str(tmp_path / "m" / "v0001"))  # no calibration file needed
    assert detector.kind == "method" and detector.threshold is None
    # Its own detector decides from the probability a Retriever of this artifact computed in the
    # same pass, when there is one; a threshold's top score means nothing to it.
    assert detector.reads_ranking_of == detector.ranking
    assert detector.probability_from(0.0, 0.25) == 0.25 and detector.probability_from(9.0, None) is None
    assert detector.probabilities(["weather forecast in Paris", "zzzz qqqq"]) == [1.0, 0.0]


def test_calibrate_needs_no_tool_queries(bm25_versions, dataset):
    from dataclasses import replace

    from components.methods import load

    with pytest.raises(ValueError, match="no-tool"):
        calibrate(load(bm25_versions["default"]), replace(dataset, neg_split={}))


def test_serving_decides_at_the_calibrated_cut_off_not_at_probability_one_half(bm25_versions, tmp_path):
    # Half the no-tool queries score exactly 0 (no known term): the logistic fit's intercept moves
    # P = 0.5 far from the score threshold whose accuracy was measured.
    rng = np.random.default_rng(0)
    tool = rng.normal(10.0, 2.0, 500)
    no_tool = np.concatenate([np.zeros(250), rng.normal(6.0, 2.0, 250)])
    fitted = calibrate_scores(tool, no_tool)
    assert abs(fitted.intercept) > 0.3  # the case at hand: P(threshold) is not 0.5
    detector_file = str(tmp_path / "detector.json")
    save_calibration(detector_file, bm25_versions["default"], fitted, "torch")
    detector = DetectorModel(bm25_versions["default"], detector_file)
    decided = fitted.probability(np.concatenate([tool, no_tool])) >= detector.decision_threshold
    assert (decided == (np.concatenate([tool, no_tool]) >= fitted.threshold)).all()
    assert acc(tool, no_tool, fitted.threshold, True) == pytest.approx(fitted.accuracy)


def test_ensure_calibration_fits_a_missing_threshold_once(bm25_versions, tmp_path, monkeypatch):
    file, artifact = str(tmp_path / "d.json"), bm25_versions["default"]
    fitted = ensure_calibration(artifact, _data(), file, "onnx")
    assert fitted is not None and find_calibration(file, artifact, "onnx") == fitted
    monkeypatch.setattr(models, "calibrate_artifact", lambda *a, **k: pytest.fail("calibrated again"))
    assert ensure_calibration(artifact, _data(), file, "onnx") == fitted  # read from the file


def detector_config(artifact: str, file: str, data: str | None) -> dict:
    """A running app's config as a swap builds it, reduced to the Detector's user config."""
    user = {"artifact": artifact, "detector_file": file, "calibration_data": data, "encoder_runtime": "onnx"}
    deployments = [{"name": "Detector", "user_config": user}]
    return {"applications": [{"name": "toolscout", "args": {}, "deployments": deployments}]}


def test_a_swap_calibrates_a_new_version_on_its_driver_before_it_deploys(
    bm25_versions, tmp_path, monkeypatch, caplog
):
    # Replicas fitted the threshold inside the deploy, on CPU often past the swap's timeout: the
    # follow then rolled a good version back. The driver fits it first; the replicas only read it.
    file, artifact = str(tmp_path / "d.json"), bm25_versions["lucene"]
    config = detector_config(artifact, file, _data())
    at_deploy = []
    monkeypatch.setattr(swap, "running_config", lambda app: config)
    monkeypatch.setattr(swap, "asked", lambda *a: {"old"})
    monkeypatch.setattr(swap, "swap_artifact", lambda running, uri, base=None: config)
    monkeypatch.setattr(swap, "retriever_config", lambda c: {"artifact": artifact})
    monkeypatch.setattr(swap, "serving_artifacts", lambda app, deployment: {artifact})
    monkeypatch.setattr(
        swap, "deploy_config", lambda *a, **k: at_deploy.append(find_calibration(file, artifact, "onnx"))
    )
    assert swap.swap_once("models:/bm25@champion", "toolscout", 1.0) == artifact
    assert at_deploy and at_deploy[0] is not None  # in the file before anything was deployed
    DetectorModel(artifact, file, encoder_runtime="onnx")  # a replica finds it (no calibration data)
    # Once there, or without calibration data (the replicas then refuse an uncalibrated version,
    # as before), nothing is fitted here.
    monkeypatch.setattr(models, "calibrate_artifact", lambda *a, **k: pytest.fail("calibrated again"))
    swap.calibrate_here(config)
    swap.calibrate_here(detector_config(bm25_versions["default"], str(tmp_path / "other.json"), None))
    assert not (tmp_path / "other.json").exists()
    # Replicas on GPUs fit their own threshold; a fit that fails here is left to the replicas.
    on_gpu = detector_config(bm25_versions["default"], str(tmp_path / "gpu.json"), _data())
    on_gpu["applications"][0]["deployments"][0]["ray_actor_options"] = {"num_gpus": 1}
    swap.calibrate_here(on_gpu)
    assert not (tmp_path / "gpu.json").exists()
    # ... also when the GPU is asked for in the app's args, where the YAML puts replica options.
    in_args = detector_config(bm25_versions["default"], str(tmp_path / "gpu_args.json"), _data())
    gpu = [{"name": "Detector", "ray_actor_options": {"num_gpus": 1}}]
    in_args["applications"][0]["args"]["deployments"] = gpu
    swap.calibrate_here(in_args)
    assert not (tmp_path / "gpu_args.json").exists()

    def fails(*args, **kwargs):
        raise MemoryError("the driver is too small")

    monkeypatch.setattr(models, "calibrate_artifact", fails)
    with caplog.at_level("WARNING", logger="components.serving.swap_calibration"):
        swap.calibrate_here(detector_config(bm25_versions["default"], str(tmp_path / "x.json"), _data()))
    assert "the driver is too small" in caplog.text
