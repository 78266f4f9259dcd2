"""BM25 on bm25s: ranking, analyzers, save/load without pickle, and the published ToolLens row."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import TOOLS

from benchmarks.bm25_reproduction import PUBLISHED  # the published ToolLens BM25 row
from components import methods
from components.data.loader import load_dataset
from components.data.tooltext import tool_document
from components.methods.bm25.analyzers import PROFILES, Analyzer
from components.methods.bm25.method import BM25Method
from components.metrics import evaluate_retrieval

CORPUS = {k: {"_id": k, "title": "", "text": v, "metadata": {}} for k, v in TOOLS.items()}


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


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_method_pickles_for_ray_before_and_after_indexing(profile):
    # The stemming profiles held a PyStemmer object, which cannot be pickled: once any instance had
    # analyzed text (the profiles share one analyzer), no BM25 method could be sent to a Ray worker.
    import pickle

    import cloudpickle

    used = BM25Method(profile)
    used.index(CORPUS)
    fresh = BM25Method(profile)
    queries = {"a": "weather forecast for my city", "b": "hotels in the city"}
    for dumps in (pickle.dumps, cloudpickle.dumps):
        assert pickle.loads(dumps(fresh)).analyzer == fresh.analyzer
        assert pickle.loads(dumps(used)).retrieve(queries, 2) == used.retrieve(queries, 2)


def test_nothing_to_index_is_a_clear_error():
    with pytest.raises(ValueError, match="bm25: nothing to index: the catalog is empty"):
        BM25Method().index({})
    stop_words_only = {"t": {"_id": "t", "title": "", "text": "the of and", "metadata": {}}}
    with pytest.raises(ValueError, match="no word of its 1 tools is indexed"):
        BM25Method().index(stop_words_only)


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
    from components.methods.bm25 import analyzers

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


@pytest.mark.parametrize(
    ("tokenizer", "tokens"),
    [
        ("whitespace", ["api-ninjas,", "u.s.a", "costs"]),
        ("word", ["api", "ninjas", "u", "s", "a", "costs"]),
    ],
)
def test_extra_tokenizers(tokenizer, tokens):
    assert Analyzer(tokenizer, "none", "none").tokens("API-Ninjas, U.S.A  costs") == tokens


def test_english_stop_list_is_lucenes_short_one_and_nltk_the_long_one():
    text = "what should I do about the weather"
    kept = ["what", "should", "i", "do", "about", "weather"]
    assert Analyzer("lucene", "english", "none").tokens(text) == kept
    assert Analyzer("lucene", "nltk", "none").tokens(text) == ["weather"]


@pytest.mark.parametrize(
    ("part", "value"), [("tokenizer", "nltk"), ("stopwords", "french"), ("stemmer", "porter2000")]
)
def test_unknown_analyzer_parts_are_rejected(part, value):
    with pytest.raises(ValueError, match=f"unknown (analyzer {part}|stemmer)"):
        Analyzer(**{part: value})


def test_scoring_variant_changes_scores_and_round_trips(tmp_path):
    queries = {"a": "weather forecast for my city", "b": "hotels in the city"}
    lucene, robertson = BM25Method("lucene"), BM25Method("lucene", variant="robertson")
    for m in (lucene, robertson):
        m.index(CORPUS)
    assert (
        lucene.score_matrix(list(queries.values())).tolist()
        != robertson.score_matrix(list(queries.values())).tolist()
    )
    robertson.save(str(tmp_path / "bm25"))
    loaded = methods.load(str(tmp_path / "bm25"))
    assert loaded.variant == "robertson"
    assert loaded.retrieve(queries, 3) == robertson.retrieve(queries, 3)
    with pytest.raises(ValueError, match="unknown BM25 variant"):
        BM25Method(variant="bm26")


def test_custom_analyzer_replaces_the_profile_and_is_saved(tmp_path):
    custom = {"tokenizer": "word", "stopwords": "nltk", "stemmer": "none"}
    m = BM25Method("lucene", analyzer=custom)
    assert m.analyzer == Analyzer(**custom)
    m.index(CORPUS)
    m.save(str(tmp_path / "bm25"))
    assert methods.load(str(tmp_path / "bm25")).config() == m.config()


def test_artifact_from_before_variants_loads_as_lucene(tmp_path):
    import json

    m = BM25Method("lucene")
    m.index(CORPUS)
    m.save(str(tmp_path / "bm25"))
    path = tmp_path / "bm25" / "config.json"
    config = json.loads(path.read_text())
    del config["variant"]
    path.write_text(json.dumps(config))
    loaded = methods.load(str(tmp_path / "bm25"))
    assert loaded.variant == "lucene"
    assert loaded.retrieve({"a": "find flights"}, 3) == m.retrieve({"a": "find flights"}, 3)


def test_tool_document_fields():
    doc = tool_document(CORPUS["1"], ["tool", "api", "required_params"])
    assert doc.startswith("Fly search flights from")
    assert tool_document(CORPUS["1"], "raw") == TOOLS["1"]


@pytest.mark.parametrize(("profile", "tolerance"), [("colt", 0.005), ("lucene", 0.012)])
def test_profiles_near_published_toollens_row(toollens, profile, tolerance):
    ds = load_dataset(str(toollens), splits=["test"])
    m = BM25Method(profile)
    m.index(ds.corpus)
    got = evaluate_retrieval(ds.qrels["test"], m.retrieve(ds.split_queries("test"), 10))
    for name, value in PUBLISHED.items():
        assert got[name] == pytest.approx(value, abs=tolerance), name


def test_colt_profile_splits_on_whitespace_and_indexes_documentation_without_schema():
    m = BM25Method("colt")
    assert m.analyzer.tokens("Search the recipes, by Name!") == ["search", "recipes,", "name!"]
    doc = "category_name:Food, tool_name:Recipes, api_name:Find, api_description:Find a recipe"
    record = {
        "_id": "9",
        "title": "",
        "text": doc + ', required_params: [], optional_params: [], return_schema: {"calories": "int"}',
    }
    assert "calories" not in tool_document(record, m.fields)
    assert "recipe" in tool_document(record, m.fields)


@pytest.mark.parametrize("module", ["components.methods.bm25.method", "components.methods.bm25.analyzers"])
@pytest.mark.parametrize("preset", [None, "cuda"])
def test_bm25s_imports_jax_on_the_cpu_without_reserving_a_gpu(tmp_path, module, preset):
    """bm25s imports JAX where installed; JAX must see the CPU default when it first initialises.

    A stand-in ``jax`` on the path records the environment at the moment bm25s imports it (bm25s
    runs a top-k at import, which is when the real JAX picks its platform and reserves memory).
    A platform the caller already chose is kept.
    """
    fake = tmp_path / "jax"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import json, os\n"
        "SEEN = {k: os.environ.get(k) for k in ('JAX_PLATFORMS', 'XLA_PYTHON_CLIENT_PREALLOCATE')}\n"
        "from jax import lax\n"
    )
    (fake / "lax.py").write_text("def top_k(x, k):\n    return sorted(x)[-k:], None\n")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    if preset:
        env["JAX_PLATFORMS"] = preset
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), root])
    code = f"import json, {module}, jax; print(json.dumps(jax.SEEN))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"JAX_PLATFORMS": preset or "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def test_tools_tied_at_the_cut_come_in_catalog_order_whatever_k():
    # Four texts repeated over 400 tools: most scores tie. A request's top k must be the first k of
    # its deeper ranking (metrics at 3 taken from a top 10, the server's over-fetch for retired tools).
    import torch

    from components.encoders.retriever import top_k
    from components.methods.bm25.method import BM25Method

    texts = ["weather forecast city", "flight search", "hotel booking", "weather forecast"]
    corpus = {f"t{i:03d}": {"title": "", "text": texts[i % 4]} for i in range(400)}
    bm25 = BM25Method()
    bm25.index(corpus)
    order = list(corpus)
    deep = bm25.retrieve({"q": "weather forecast"}, 400)["q"]
    ranked = sorted(deep, key=lambda t: (-deep[t], order.index(t)))
    for k in range(1, 60):
        assert set(bm25.retrieve({"q": "weather forecast"}, k)["q"]) == set(ranked[:k]), k
    # The dense and MassTool path (a score matrix): the same rule.
    scores = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.5]])
    for k in range(1, 5):
        assert list(top_k(scores, ["q"], order[:5], k)["q"]) == ["t001", "t002", "t003", "t000"][:k]


def test_one_field_may_be_given_as_a_string():
    from components.methods.bm25.method import BM25Method

    bm25 = BM25Method(fields="description")
    assert bm25.fields == ["description"]
    bm25.index(CORPUS)
    assert next(iter(bm25.retrieve({"q": "weather forecast for a city"}, 1)["q"])) == "0"
