"""The detector and retriever as loaded in a replica: one artifact version, held in memory.

These are the in-process fast path: the Serve deployments wrap them, and the load benchmark calls
them directly for its baseline. Loading happens once per version (never per request).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from components import methods
from components.data import open_dataset
from components.encoders.runtimes import AUTO, check_runtime, effective_runtime
from components.methods.base import Method
from components.metrics import by_score
from components.registry import resolve
from components.serving.calibration import (
    ScoreThreshold,
    calibrate,
    calibration_key,
    find_calibration,
    has_detect,
    has_legacy_calibration,
    model_version,
    save_calibration,
    top1_scores,
)
from components.serving.catalog import ToolCatalog

Ranking = list[tuple[str, float]]


def top_score(ranking: Ranking) -> float:
    """A ranking's best score, 0 when it is empty (as :func:`.calibration.top1_scores` scores): what
    a score-threshold detector reads from a Retriever's ranking (:meth:`DetectorModel.probability_from`)."""
    return float(ranking[0][1]) if ranking else 0.0


def same_ranking(reads: str | None, ranking: str | None) -> bool:
    """Whether a detector that reads ``reads`` (:attr:`DetectorModel.reads_ranking_of`) can decide
    from a Retriever answer ranked with ``ranking`` (:func:`ranking_key`): neither may be unknown."""
    return reads is not None and reads == ranking


# Where served text encoders run unless the config says otherwise (the model classes below default
# to PyTorch, so a benchmark in process measures what it asks for): "auto", the fastest runtime
# within 0.002 R@3 / N@3 of PyTorch for the CPU each replica runs on (effective_runtime; measured
# by benchmarks/encoder_runtime.py: OpenVINO bf16 on native-bf16 CPUs, else ONNX Runtime fp32).
DEFAULT_ENCODER_RUNTIME = AUTO


def load_method(
    artifact: str,
    encoder_runtime: str = "torch",
    lm_engine: str | None = None,
    lm_endpoint: dict[str, Any] | None = None,
) -> Method:
    """The method saved at ``artifact``, its text encoders (dense, MassTool) running their inference
    on ``encoder_runtime`` (:data:`components.encoders.runtimes.RUNTIMES`) and, with ``lm_engine``
    (``transformers`` / ``llama.cpp`` / ``vllm`` at ``lm_endpoint``), a generative method's (ToolGen,
    ToolWeaver) constrained decoder on that engine instead of the one it was saved with. What a
    method does not have (BM25's encoders, dense's LM) has nothing to move."""
    check_runtime(encoder_runtime)  # each encoder resolves it for its device (TextEncoder.use_runtime)
    path, name = methods.artifact_method(artifact)
    cls = methods.method_class(name)
    if lm_engine is not None and "generate" in cls.capabilities:
        # Loaded for that engine from the start: on vllm the replica never holds the LM's weights.
        given = {"engine": lm_engine, "engine_endpoint": lm_endpoint}
        method = cls.load(path, overrides={k: v for k, v in given.items() if v is not None})
    else:
        method = cls.load(path)
    if encoder_runtime != "torch" and "text_encoders" in method.capabilities:
        for encoder in method.text_encoders():
            encoder.use_runtime(encoder_runtime)
    return method


def ranking_key(artifact: str, encoder_runtime: str, lm_engine: str | None) -> str:
    """What the scores of ``artifact`` loaded on this runtime and engine are: its directory, its
    version and config hash, and the runtime and engine where they move its scores (as keyed by
    :func:`.calibration.calibration_key`). A Detector decides from a Retriever's ranking only
    under the same key (:attr:`DetectorModel.reads_ranking_of`)."""
    return f"{artifact}|{calibration_key(artifact, encoder_runtime, lm_engine)}"


def artifact_dir(artifact: str, source: str | None = None, registry: dict[str, Any] | None = None) -> str:
    """The local directory to load ``artifact`` from: the directory itself, or, on a node of the
    cluster where that pinned registry version was never materialised, the version ``source``
    (``models:/<name>/<N>``) names, materialised here through ``registry``
    (:func:`components.serving.app.pinned`)."""
    path = os.path.abspath(resolve(artifact, registry))
    if source is not None and not os.path.isdir(path):
        path = os.path.abspath(resolve(source, registry))
    return path


class RetrieverModel:
    """A trained method's artifact (BM25, dense, MassTool, ...) ready to rank the catalog, its text
    encoders on ``encoder_runtime`` and its LM decoder on ``lm_engine`` (see :func:`load_method`)."""

    def __init__(
        self,
        artifact: str,
        encoder_runtime: str = "torch",
        lm_engine: str | None = None,
        lm_endpoint: dict[str, Any] | None = None,
        source: str | None = None,
        registry: dict[str, Any] | None = None,
    ) -> None:
        self.artifact = artifact_dir(artifact, source, registry)
        self.source = source  # the registry version it is (models:/<name>/<N>), if it is one
        encoder_runtime = self.encoder_runtime = effective_runtime(encoder_runtime)  # "auto" resolved
        self.method = load_method(self.artifact, encoder_runtime, lm_engine, lm_endpoint)
        self.version = model_version(self.artifact)
        self.ranking = ranking_key(self.artifact, encoder_runtime, lm_engine)

    def retrieve(self, texts: list[str], k: int) -> list[Ranking]:
        """Top-``k`` ``(tool id, score)`` for each text, best first."""
        return self._rankings(
            self.method.retrieve({str(i): t for i, t in enumerate(texts)}, k), len(texts), k
        )

    def retrieve_detected(self, texts: list[str], k: int) -> list[tuple[Ranking, float | None]]:
        """:meth:`retrieve`, with P(needs a tool) from the same pass for a method with its own
        detector (MassTool: ``retrieve_detected``), else ``None``."""
        if "detect" not in self.method.capabilities:
            return [(r, None) for r in self.retrieve(texts, k)]
        results, detected = self.method.retrieve_detected({str(i): t for i, t in enumerate(texts)}, k)
        rankings = self._rankings(results, len(texts), k)
        return [(r, float(detected[str(i)])) for i, r in enumerate(rankings)]

    @staticmethod
    def _rankings(results: dict[str, dict[str, float]], n: int, k: int) -> list[Ranking]:
        # Equal scores in the method's order, as evaluation ranks (components.metrics.ranked): the
        # ranking served is the one the figures scored (BM25 ties often, e.g. at the cut-off).
        return [sorted(results.get(str(i), {}).items(), key=by_score)[:k] for i in range(n)]

    def size(self) -> int:
        return len(self.method.tool_ids)


def named(ranking: Ranking, catalog: ToolCatalog) -> list[dict[str, Any]]:
    """A ranking as API tool hits."""
    return [{"id": t, "name": catalog.name(t), "score": float(s)} for t, s in ranking]


class DetectorModel:
    """P(needs a tool) per query: the method's own ``detect`` when it has one (MassTool), else a
    score threshold calibrated on valid (see :mod:`.calibration`).

    Args:
        artifact: Artifact dir (or a registry URI, resolved through ``$MLFLOW_TRACKING_URI``).
        detector_file: JSON of threshold calibrations; read, and written when calibrating here.
        calibration_data: Dataset dir to calibrate on when ``detector_file`` has no entry.
        splits: The ``splits`` config used to carve valid from train (as in training).
        encoder_runtime: Where the method's text encoders run (see :func:`load_method`).
        source, registry: The registry version ``artifact`` pins (see :func:`artifact_dir`).
        lm_engine, lm_endpoint: A generative method's decoding engine, as the Retriever's (its
            score threshold decodes too: on ``vllm`` this replica never holds the LM's weights).
    """

    def __init__(
        self,
        artifact: str,
        detector_file: str | None = None,
        calibration_data: str | None = None,
        splits: dict[str, Any] | None = None,
        encoder_runtime: str = "torch",
        source: str | None = None,
        registry: dict[str, Any] | None = None,
        lm_engine: str | None = None,
        lm_endpoint: dict[str, Any] | None = None,
    ) -> None:
        self.artifact = artifact_dir(artifact, source, registry)
        self.version = model_version(self.artifact)
        encoder_runtime = self.encoder_runtime = effective_runtime(encoder_runtime)  # as the Retriever's
        self.method = load_method(self.artifact, encoder_runtime, lm_engine, lm_endpoint)
        self.ranking = ranking_key(self.artifact, encoder_runtime, lm_engine)
        self.threshold: ScoreThreshold | None = None
        if "detect" in self.method.capabilities:
            self.kind = "method"
            return
        self.kind = "score_threshold"
        served_on = (encoder_runtime, lm_engine)  # the calibration must be of the scores served here
        self.threshold = find_calibration(detector_file, self.artifact, *served_on)
        if self.threshold is None:
            if not calibration_data:
                older = (
                    " (its entry predates calibrations kept per encoder runtime and LM engine: "
                    "calibrate again)"
                    if has_legacy_calibration(detector_file, self.artifact)
                    else ""
                )
                raise ValueError(
                    f"{self.version} has no detect(); calibrate a threshold first (toolscout serve "
                    f"--calibrate-only) or give calibration_data; {detector_file or 'no detector file'} "
                    f"has no entry for it scored on encoder runtime {encoder_runtime!r}, LM engine "
                    f"{lm_engine or 'as saved'!r}{older}"
                )
            self.threshold = calibrate(self.method, open_dataset(calibration_data, splits))
            if detector_file:
                save_calibration(detector_file, self.artifact, self.threshold, *served_on)

    @property
    def decision_threshold(self) -> float:
        """The probability from which a query needs a tool: the method's own ``detect_threshold``
        (what ``toolscout evaluate`` reports detection accuracy at), else the calibrated
        probability at the chosen score cut-off (:meth:`ScoreThreshold.at_threshold`)."""
        if self.kind == "method":
            return float(self.method.detect_threshold)
        return self.threshold.at_threshold()

    @functools.cached_property
    def reads_ranking_of(self) -> str | None:
        """The ranking (:func:`ranking_key`) whose Retriever answer this detector can decide
        from, or ``None``.

        A Retriever ranking with the same artifact on the same runtime and engine computes what
        this detector needs while it ranks a query: the top score a threshold reads, or the
        probability of the method's own detection tower (MassTool's towers share one pass,
        ``retrieve_detected``). So the ingress can hand it over instead of having the query
        encoded twice (:meth:`probability_from`). ``None`` for a threshold over a method whose top
        score depends on the k asked for (beam searches, query generation's fused depth: without
        the ``exact_scores`` capability), since calibration ranked with k = 1.
        """
        if self.kind == "score_threshold" and "exact_scores" not in self.method.capabilities:
            return None
        return self.ranking

    def probability_from(self, top_score: float, detected: float | None) -> float | None:
        """P(needs a tool) from a Retriever answer of :attr:`reads_ranking_of`: its ranking's top
        score (over all the artifact's tools, 0 for an empty ranking, as
        :func:`.calibration.top1_scores` scores) for a threshold, the probability its method
        ``detected`` in the same pass for a method's own detector (``None``: not there)."""
        if self.threshold is None:
            return detected
        return float(self.threshold.probability(np.array([top_score]))[0])

    def answer(self, probability: float) -> dict[str, Any]:
        """A Detector answer: ``{"probability", "threshold", "version", "reads_ranking_of"}``."""
        return {
            "probability": probability,
            "threshold": self.decision_threshold,
            "version": self.version,
            "reads_ranking_of": self.reads_ranking_of,
        }

    def probabilities(self, texts: list[str]) -> list[float]:
        """P(needs a tool) for each text."""
        if self.threshold is None:
            probs = self.method.detect({str(i): t for i, t in enumerate(texts)})
            return [float(probs[str(i)]) for i in range(len(texts))]
        return [float(p) for p in self.threshold.probability(top1_scores(self.method, texts))]


def calibrate_artifact(
    artifact: str,
    data: str,
    detector_file: str,
    splits: dict[str, Any] | None = None,
    encoder_runtime: str = "torch",
    lm_engine: str | None = None,
    lm_endpoint: dict[str, Any] | None = None,
) -> ScoreThreshold | None:
    """Calibrate ``artifact``'s threshold detector on ``data`` and store it (``None``: it has ``detect``).

    The scores are those of the encoder runtime and LM engine the replicas will serve on (int8 moves
    them a little); the file keys calibrations by artifact, runtime and engine, so a replica on
    another runtime finds no threshold fitted on other scores.
    """
    method = load_method(resolve(artifact), encoder_runtime, lm_engine, lm_endpoint)
    if "detect" in method.capabilities:
        return None
    detector = calibrate(method, open_dataset(data, splits))
    save_calibration(detector_file, artifact, detector, encoder_runtime, lm_engine)
    return detector


def ensure_calibration(
    artifact: str,
    data: str,
    detector_file: str,
    encoder_runtime: str = DEFAULT_ENCODER_RUNTIME,
    splits: dict[str, Any] | None = None,
    lm_engine: str | None = None,
    lm_endpoint: dict[str, Any] | None = None,
) -> ScoreThreshold | None:
    """``artifact``'s stored threshold for ``encoder_runtime`` and ``lm_engine``, calibrated on
    ``data`` first if the file has none (:func:`calibrate_artifact`); ``None`` when its method has
    ``detect`` (then nothing is loaded)."""
    found = find_calibration(detector_file, artifact, encoder_runtime, lm_engine)
    if found is not None or has_detect(artifact):
        return found
    return calibrate_artifact(artifact, data, detector_file, splits, encoder_runtime, lm_engine, lm_endpoint)
