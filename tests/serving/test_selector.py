"""The local selector LM: trained for real, constrained to the candidates, typed JSON arguments."""

from __future__ import annotations

import json
import random

import pytest
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import SELECTOR_LM, torch_threads

from components.methods import load
from components.serving.selector_lm import LMSelector
from components.serving.selector_train import train_selector_lm


@pytest.fixture(scope="module")
def trained(selector_lm, catalog) -> LMSelector:
    return LMSelector(selector_lm[0], catalog)


@pytest.fixture(scope="module")
def untrained(dataset, catalog, tmp_path_factory) -> LMSelector:
    out = str(tmp_path_factory.mktemp("untrained"))
    with torch_threads(1):
        train_selector_lm(dataset, catalog, out, lm=SELECTOR_LM, steps=1, lr=1e-9)
    return LMSelector(out, catalog)


def accuracy(selector: LMSelector, dataset, bm25, n: int = 150) -> float:
    queries = dict(list(dataset.split_queries("test").items())[:n])
    ranked = bm25.retrieve(queries, 5)
    hits = 0
    for qid, text in queries.items():
        candidates = sorted(ranked[qid], key=lambda t: -ranked[qid][t])
        call = selector.select(text, [], candidates) if candidates else None
        hits += bool(call) and call["tool"] in dataset.qrels["test"][qid]
    return hits / len(queries)


def test_training_lowers_the_loss(selector_lm):
    _, report = selector_lm
    assert report["last_loss"] < report["first_loss"] * 0.5 and report["examples"] > 100


def test_trained_selector_beats_untrained(trained, untrained, dataset, bm25_versions):
    bm25 = load(bm25_versions["default"])
    with torch_threads(1):
        good, bad = accuracy(trained, dataset, bm25), accuracy(untrained, dataset, bm25)
    print(good, bad)
    assert good > bad + 0.15, (good, bad)


def test_only_candidates_can_be_named_and_arguments_follow_the_schema(trained, catalog, dataset):
    rng = random.Random(0)
    ids = list(catalog.tools)
    queries = list(dataset.split_queries("test").values())[:25]
    for query in queries:
        candidates = rng.sample(ids, 3)  # unrelated candidates: the LM must still pick one of them
        call = trained.select(query, [], candidates)
        assert call is not None and call["tool"] in candidates
        tool = catalog.tools[call["tool"]]
        assert [p.name for p in tool.required] == list(call["arguments"])
        for param in tool.required:
            value = call["arguments"][param.name]
            expected = {"integer": int, "number": (int, float), "boolean": bool, "array": list}.get(
                param.type, str
            )
            assert isinstance(value, expected) and value != ""
        assert json.loads(json.dumps(call["arguments"])) == call["arguments"]


def test_no_known_candidate_means_no_call(trained):
    assert trained.select("weather in Paris", [], ["not-a-tool"]) is None
    assert trained.select("weather in Paris", [], []) is None


class _Vocab:
    """A tokenizer's decode surface over a fixed vocabulary (what TypeMasks reads)."""

    tokens = ("<s>", " 1", "2", "²", " ³", "٣", "a", " x")
    all_special_ids = (0,)

    def __len__(self) -> int:
        return len(self.tokens)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.tokens[i] for i in ids)


def test_number_masks_accept_ascii_digits_only():
    from components.serving.selector_lm import TypeMasks

    masks = TypeMasks(_Vocab(), len(_Vocab.tokens))
    # "²", " ³" and "٣" pass str.isdigit() but int() rejects them.
    assert masks.digits_first.tolist() == [False, True, True, False, False, False, False, False]
    assert masks.digits_next.tolist() == [False, False, True, False, False, False, False, False]
    assert masks.string.tolist() == [False, True, True, True, True, True, True, True]
