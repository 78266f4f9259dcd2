"""Tool-usage detection for methods without a ``detect``: a threshold on the top-1 retrieval score.

A query that needs a tool usually matches some tool well; chit-chat matches none. The threshold
is chosen on the valid split (tool queries vs the valid no-tool queries) to maximise accuracy, and
a one-feature logistic regression on ``score - threshold``, fitted on the same data (Platt
scaling, Platt 1999), turns scores into probabilities. By default both weigh the two classes
equally (balanced accuracy; class-weighted fit): valid splits hold many more tool queries than
no-tool ones (about 10:1 in the quickstart, 6:1 in ToolLens), and plain accuracy is then often
maximised by calling everything a tool. ``balanced=False`` gives the plain-accuracy variant.
Calibrations are kept per artifact in one JSON file, keyed by the artifact's version and config
hash, so a hot-swap to another version finds its own threshold.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from components.data.types import Dataset
from components.encoders.runtimes import effective_runtime
from components.registry import resolve


def model_version(artifact: str) -> str:
    """``<model>/<version>`` of an artifact dir (e.g. ``bm25/v0002``; a registry version's local
    dir gives ``<name>/v<N>``), a registry URI resolved first."""
    path = os.path.abspath(resolve(artifact))
    return f"{os.path.basename(os.path.dirname(path))}/{os.path.basename(path)}"


def artifact_key(artifact: str) -> str:
    """A portable key for an artifact: its version plus a hash of its ``config.json``."""
    with open(os.path.join(resolve(artifact), "config.json"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    return f"{model_version(artifact)}@{digest}"


@dataclass
class ScoreThreshold:
    """``P(needs tool) = sigmoid(slope * (top1 - threshold) + intercept)``, fitted on valid."""

    threshold: float
    slope: float
    intercept: float
    accuracy: float  # valid (balanced) accuracy of ``top1 >= threshold``
    n_tool: int
    n_no_tool: int
    balanced: bool = True

    def probability(self, top1: np.ndarray) -> np.ndarray:
        z = self.slope * (np.asarray(top1, dtype=np.float64) - self.threshold) + self.intercept
        return 1.0 / (1.0 + np.exp(-np.clip(z, -50.0, 50.0)))

    def at_threshold(self) -> float:
        """The probability at the chosen score threshold: deciding ``probability >= this`` is
        deciding ``top1 >= threshold``, the cut-off whose accuracy was measured. The fitted
        intercept moves P = 0.5 off that cut-off wherever the scores are not two bell curves
        (many no-tool queries scoring exactly 0, as BM25 gives a query with no known term)."""
        return float(self.probability(np.array([self.threshold]))[0])


def best_threshold(tool: np.ndarray, no_tool: np.ndarray, balanced: bool = True) -> tuple[float, float]:
    """The threshold on scores (tool if ``score >= t``) with the highest (balanced) accuracy, and it.

    Candidates are midpoints between consecutive distinct scores plus both ends, so every split of
    the sorted scores is tried once (O(n log n)).
    """
    scores = np.concatenate([tool, no_tool]).astype(np.float64)
    labels = np.concatenate([np.ones(len(tool)), np.zeros(len(no_tool))])
    order = np.argsort(scores, kind="stable")
    scores, labels = scores[order], labels[order]
    distinct = np.unique(scores)
    candidates = np.concatenate(
        [[distinct[0] - 1.0], (distinct[:-1] + distinct[1:]) / 2, [distinct[-1] + 1.0]]
    )
    # With threshold t, items below t are called "no tool": correct = negatives below + positives at/above.
    below = np.searchsorted(scores, candidates, side="left")
    neg_below = np.concatenate([[0], np.cumsum(1 - labels)])[below]
    pos_above = labels.sum() - np.concatenate([[0], np.cumsum(labels)])[below]
    if balanced:
        accuracy = (neg_below / len(no_tool) + pos_above / len(tool)) / 2
    else:
        accuracy = (neg_below + pos_above) / len(scores)
    best = int(np.argmax(accuracy))
    return float(candidates[best]), float(accuracy[best])


def fit_logistic(
    x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None, l2: float = 1e-3, iters: int = 50
) -> tuple[float, float]:
    """Slope and intercept of a weighted 1-D logistic regression by Newton's method (small L2 keeps
    it finite on separable data)."""
    x = np.asarray(x, dtype=np.float64)
    w_obs = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    scale = float(np.std(x)) or 1.0  # Newton on standardised x is well conditioned for any score range
    features = np.stack([x / scale, np.ones_like(x)], axis=1)
    w = np.zeros(2)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(features @ w, -50.0, 50.0)))
        grad = features.T @ (w_obs * (p - y)) + l2 * w
        hess = features.T @ (features * (w_obs * p * (1 - p))[:, None]) + l2 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(w[0] / scale), float(w[1])


def top1_scores(method: Any, texts: list[str]) -> np.ndarray:
    """The best retrieval score of each text (0 when the method returns nothing, e.g. no known term)."""
    results = method.retrieve({str(i): t for i, t in enumerate(texts)}, 1)
    return np.array([max(results.get(str(i), {}).values(), default=0.0) for i in range(len(texts))])


def calibrate(method: Any, dataset: Dataset, split: str = "valid", balanced: bool = True) -> ScoreThreshold:
    """Fit the threshold detector for ``method`` on ``split`` (tool queries vs no-tool queries)."""
    tool_texts = list(dataset.split_queries(split).values())
    no_tool_texts = list(dataset.neg_split.get(split, []))
    if not tool_texts or not no_tool_texts:
        raise ValueError(
            f"calibration needs tool and no-tool queries in {split!r}: got {len(tool_texts)} and "
            f"{len(no_tool_texts)} (the dataset needs tooldet/neg_queries.jsonl)"
        )
    return calibrate_scores(top1_scores(method, tool_texts), top1_scores(method, no_tool_texts), balanced)


def calibrate_scores(tool: np.ndarray, no_tool: np.ndarray, balanced: bool = True) -> ScoreThreshold:
    """The threshold detector for these top-1 scores of tool and no-tool queries."""
    threshold, accuracy = best_threshold(tool, no_tool, balanced)
    x = np.concatenate([tool, no_tool]) - threshold
    y = np.concatenate([np.ones(len(tool)), np.zeros(len(no_tool))])
    # Class weights n / (2 n_class): equal priors, so P = 0.5 sits near the balanced threshold.
    weights = np.where(y == 1, len(y) / (2 * len(tool)), len(y) / (2 * len(no_tool))) if balanced else None
    slope, intercept = fit_logistic(x, y, weights)
    return ScoreThreshold(threshold, slope, intercept, accuracy, len(tool), len(no_tool), balanced)


def read_calibrations(path: str) -> dict[str, dict[str, Any]]:
    """Every calibration in a detector file, by :func:`calibration_key` (empty if the file does not
    exist)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f).get("calibrations", {})


def calibration_key(artifact: str, encoder_runtime: str, lm_engine: str | None) -> str:
    """The key of ``artifact``'s calibration when it is served on ``encoder_runtime`` and
    ``lm_engine``, where those move its scores: int8 ONNX moves a dense model's cosines (by up to
    ~0.05), another engine a generative model's scores, so a threshold fitted on one is not the
    threshold of the other. A method without text encoders (BM25) or without an LM keeps one entry
    whatever the setting (``-``); ``lm_engine`` None is the engine the artifact was saved with.
    The method's class decides, not the loaded instance (the key is read before anything loads):
    a query-generation artifact is keyed per runtime even over BM25, and an engine named
    explicitly is its own entry even when it is the saved one. Both only cost a calibration.
    ``auto`` and ``openvino-bf16`` are keyed as what runs on this CPU (:func:`effective_runtime`)."""
    return _key(artifact, scoring(artifact, encoder_runtime, lm_engine))


def _key(artifact: str, scored_on: tuple[str, str]) -> str:
    return "|".join((artifact_key(artifact), *scored_on))


def scoring(artifact: str, encoder_runtime: str, lm_engine: str | None) -> tuple[str, str]:
    """(runtime, engine) as far as they move ``artifact``'s scores (see :func:`calibration_key`)."""
    from components.methods import artifact_method, method_class

    capabilities = method_class(artifact_method(artifact)[1]).capabilities
    runtime = effective_runtime(encoder_runtime) if "text_encoders" in capabilities else "-"
    engine = (lm_engine or "saved") if "generate" in capabilities else "-"
    return runtime, engine


def has_detect(artifact: str) -> bool:
    """Whether the artifact's method detects tool use itself (no calibration needed); read from its
    ``config.json``, nothing loaded."""
    from components.methods import artifact_method, method_class

    return "detect" in method_class(artifact_method(artifact)[1]).capabilities


def find_calibration(
    path: str | None, artifact: str, encoder_runtime: str, lm_engine: str | None = None
) -> ScoreThreshold | None:
    """The calibration stored for ``artifact`` scored on ``encoder_runtime`` / ``lm_engine``, if any."""
    if not path:
        return None
    calibrations = read_calibrations(path)
    scored_on = scoring(artifact, encoder_runtime, lm_engine)
    entry = calibrations.get(_key(artifact, scored_on))
    if entry is None and scored_on == ("-", "-"):
        # A file written before calibrations were kept per runtime and engine keyed them by the
        # artifact alone: for a method whose scores neither moves (BM25) that entry still holds.
        entry = calibrations.get(artifact_key(artifact))
    return ScoreThreshold(**entry["detector"]) if entry else None


def has_legacy_calibration(path: str | None, artifact: str) -> bool:
    """Whether ``path`` holds ``artifact``'s calibration in the format keyed by artifact alone
    (before runtimes and engines were part of the key), which a method with text encoders or an LM
    cannot trust: it was fitted on scores of a runtime no one recorded."""
    return bool(path) and artifact_key(artifact) in read_calibrations(str(path))


def save_calibration(
    path: str,
    artifact: str,
    detector: ScoreThreshold,
    encoder_runtime: str,
    lm_engine: str | None = None,
) -> None:
    """Add (or replace) ``artifact``'s calibration for the given runtime and engine in ``path``;
    written atomically (replicas may read it) and under a file lock (replicas calibrating at once
    would each write the file they read, dropping one another's entries)."""
    from filelock import FileLock

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with FileLock(f"{path}.lock"):
        calibrations = read_calibrations(path)
        calibrations[calibration_key(artifact, encoder_runtime, lm_engine)] = {
            "artifact": os.path.abspath(resolve(artifact)),
            "encoder_runtime": encoder_runtime,
            "lm_engine": lm_engine,
            "detector": asdict(detector),
        }
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"kind": "score_threshold", "calibrations": calibrations}, f, indent=2, sort_keys=True)
        os.replace(tmp, path)
