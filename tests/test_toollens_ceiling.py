"""The ToolLens ceiling benchmark: the lexical scene model, the α mix chosen on valid, the oracle bound."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.toollens_ceiling import LexicalSceneModel, compare, markdown, oracle_recall
from components.data.types import Dataset

TOOLS = ["t0", "t1", "t2", "t3"]
SCENES = {"s0": ["t0", "t1"], "s1": ["t2", "t3"]}


def _dataset() -> Dataset:
    texts = {
        **{
            f"a{i}": f"cook a {food} recipe with nutrition facts"
            for i, food in enumerate(["rice", "beans", "soup", "pie"])
        },
        **{
            f"b{i}": f"book a flight to {city} and a hotel"
            for i, city in enumerate(["paris", "rome", "oslo", "lima"])
        },
        "va": "cook a pasta recipe",
        "vb": "book a flight to berlin",
    }
    train = [q for q in texts if q[1:].isdigit()]
    scene_of = {q: "s0" if q.startswith(("a", "va")) else "s1" for q in texts}
    qrels = {q: dict.fromkeys(SCENES[scene_of[q]], 1) for q in texts}
    corpus = {t: {"_id": t, "title": "", "text": t, "metadata": {}} for t in TOOLS}
    return Dataset(
        name="tiny",
        corpus=corpus,
        queries=texts,
        qrels={
            "train": {q: qrels[q] for q in train},
            "valid": {"va": qrels["va"]},
            "test": {"vb": qrels["vb"]},
        },
        query_scene={"train": {q: scene_of[q] for q in train}},
        scene_tool=SCENES,
    )


def test_lexical_model_ranks_the_recognised_scenes_tools_first():
    ds = _dataset()
    scores = LexicalSceneModel().fit(ds, TOOLS).scores(["cook a pasta recipe", "book a flight to berlin"])
    assert scores.shape == (2, 4)
    assert set(np.argsort(-scores[0])[:2]) == {0, 1}
    assert set(np.argsort(-scores[1])[:2]) == {2, 3}
    assert scores.sum(axis=1) == pytest.approx([2.0, 2.0])  # each scene has two tools


def test_oracle_takes_the_better_ranking_per_query():
    qrels = {"q1": {"t0": 1}, "q2": {"t2": 1}}
    good_on_q1 = {"q1": {"t0": 1.0}, "q2": {"t0": 1.0}}
    good_on_q2 = {"q1": {"t3": 1.0}, "q2": {"t2": 1.0}}
    assert oracle_recall(qrels, [good_on_q1], k=1) == 0.5
    assert oracle_recall(qrels, [good_on_q1, good_on_q2], k=1) == 1.0
    # A tool of relevance 0 is not needed, and a query that needs none is left out.
    graded = {"q1": {"t0": 1, "t1": 0}, "q3": {"t1": 0}}
    assert oracle_recall(graded, [{"q1": {"t0": 1.0}, "q3": {}}], k=1) == 1.0


def test_compare_reports_each_model_the_mix_and_the_bound():
    ds = _dataset()
    right = {"valid": np.array([[1.0, 0.9, 0.0, 0.0]]), "test": np.array([[0.0, 0.0, 1.0, 0.9]])}
    wrong = {split: m[:, ::-1].copy() for split, m in right.items()}
    splits = {
        "valid": (["va"], right["valid"], wrong["valid"]),
        "test": (["vb"], right["test"], wrong["test"]),
    }
    rows = compare(ds, TOOLS, splits)
    by = {(r["method"], r["split"]): r for r in rows}
    assert by[("masstool", "test")]["metrics"]["recall@3"] == 1.0
    assert by[("mix", "test")]["config"] == {"alpha": 0.0}  # valid prefers the right model alone
    assert by[("oracle_of_two", "test")]["metrics"] == {"recall@3": 1.0}
    assert "| mix (α 0.0) | test | 1.0000 |" in markdown(rows)
