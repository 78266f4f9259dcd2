"""BM25 on bm25s: ranking, analyzers, save/load without pickle, and the published ToolLens row."""

from __future__ import annotations

import os

import pytest
from conftest import TOOLS

from components import methods
from components.data.loader import load_dataset
from components.data.tooltext import tool_document
from components.methods.analyzers import PROFILES, Analyzer
from components.methods.bm25 import BM25Method
from components.metrics import evaluate_retrieval

CORPUS = {k: {"_id": k, "title": "", "text": v, "metadata": {}} for k, v in TOOLS.items()}
# Published BM25 row on ToolLens test (COLT, CIKM 2024; repeated in MassTool, arXiv 2507.00487).
PUBLISHED = {"recall@3": 0.2158, "recall@5": 0.2688, "ndcg@3": 0.2319, "ndcg@5": 0.2609}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_matching_terms_rank_the_right_tool_first(profile):
    m = BM25Method(profile)
    m.index(CORPUS)
    results = m.retrieve(
        {"a": "weather forecast for my city", "b": "hotels in the city", "c": "an ingredient"}, k=2
    )
    assert max(results["a"], key=results["a"].get) == "0"
    assert max(results["b"], key=results["b"].get) == "2"
    assert list(results["c"]) == ["3"]  # only tools sharing a term get a score


def test_query_without_known_terms_gets_empty_ranking():
    m = BM25Method()
    m.index(CORPUS)
    assert m.retrieve({"x": "zzzz qqqq"}, k=3) == {"x": {}}


def test_save_load_round_trip_without_pickle(tmp_path):
    m = BM25Method("lucene", fields=["tool", "api", "description"])
    m.index(CORPUS)
    m.save(str(tmp_path / "bm25"))
    files = [f for _, _, fs in os.walk(tmp_path) for f in fs]
    assert files and all(f.endswith((".json", ".npy")) for f in files)
    loaded = methods.load(str(tmp_path / "bm25"))
    queries = {"a": "find flights", "b": "salmon recipes"}
    assert loaded.retrieve(queries, 3) == m.retrieve(queries, 3)
    assert loaded.config() == m.config()
    assert loaded.analyzer == m.analyzer  # the saved analyzer, not whatever the preset is today


def test_load_uses_the_analyzer_the_index_was_built_with(tmp_path, monkeypatch):
    from components.methods import analyzers

    m = BM25Method("lucene")
    m.index(CORPUS)
    m.save(str(tmp_path / "bm25"))
    other = analyzers.Analyzer("default", "english", "english")
    changed = {**analyzers.PROFILES["lucene"], "analyzer": other}
    monkeypatch.setitem(analyzers.PROFILES, "lucene", changed)  # a later release changes the preset
    assert methods.load(str(tmp_path / "bm25")).analyzer == analyzers.Analyzer("lucene", "none", "porter")


def test_load_rejects_a_non_artifact_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        methods.load(str(tmp_path))


def test_unknown_profile_and_method():
    with pytest.raises(ValueError, match="unknown BM25 profile"):
        BM25Method("nope")
    with pytest.raises(KeyError, match="unknown method"):
        methods.build("nope")


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("category_name:Food, api_name:/v1/nutrition", ["category_name:food", "api_nam", "v1", "nutrit"]),
        ("U.S.A costs 1,000.50 dollars", ["u.s.a", "cost", "1,000.50", "dollar"]),
        ("I'm searching the API-Ninjas", ["i'm", "search", "the", "api", "ninja"]),
    ],
)
def test_lucene_standard_tokenizer(text, tokens):
    assert PROFILES["lucene"]["analyzer"].tokens(text) == tokens


def test_default_analyzer_drops_stopwords_and_stems():
    assert Analyzer().tokens("The forecasts of the weather") == ["forecast", "weather"]


def test_tool_document_fields():
    doc = tool_document(CORPUS["1"], ["tool", "api", "required_params"])
    assert doc.startswith("Fly search flights from")
    assert tool_document(CORPUS["1"], "raw") == TOOLS["1"]


def test_lucene_profile_near_published_toollens_row(toollens):
    ds = load_dataset(str(toollens), splits=["test"])
    m = BM25Method("lucene")
    m.index(ds.corpus)
    got = evaluate_retrieval(ds.qrels["test"], m.retrieve(ds.split_queries("test"), 10))
    for name, value in PUBLISHED.items():
        assert got[name] == pytest.approx(value, abs=0.012), name
