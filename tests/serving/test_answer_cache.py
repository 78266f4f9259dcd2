"""The answer cache of the Detector and Retriever: exact answers, LRU bounds, and no stale answer
after a hot-swap. In-process, with real BM25 artifacts (two versions that rank differently)."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import unbatched

from components.serving.answer_cache import AnswerCache, normalise_query
from components.serving.deployments import Detector
from components.serving.models import DetectorModel, RetrieverModel, named
from components.serving.retriever_deployment import Retriever


def test_normalising_keeps_case_and_folds_only_whitespace_and_unicode_form():
    assert normalise_query("  hotel \t in\n Berlin  ") == "hotel in Berlin"
    assert normalise_query("cafe\u0301 near me") == "caf\u00e9 near me"  # NFD -> NFC
    assert normalise_query("Paris") != normalise_query("paris")


def test_least_recently_used_goes_first_and_size_zero_keeps_nothing():
    cache: AnswerCache[int] = AnswerCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recent, so "b" goes next
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert cache.stats() == {"size": 2, "entries": 2, "hits": 3, "misses": 1}
    cache.resize(1)
    assert len(cache) == 1 and cache.get("c") == 3  # the most recent stays
    off: AnswerCache[int] = AnswerCache(0)
    off.put("a", 1)
    assert off.get("a") is None and len(off) == 0
    with pytest.raises(ValueError, match=">= 0"):
        AnswerCache(-1)


def differing_query(bm25_versions, queries: list[str]) -> str:
    """A query the two BM25 versions rank differently (else the swap test could not fail)."""
    old, new = RetrieverModel(bm25_versions["default"]), RetrieverModel(bm25_versions["lucene"])
    for q in queries:
        if old.retrieve([q], 3)[0] != new.retrieve([q], 3)[0]:
            return q
    raise AssertionError("the default and lucene BM25 versions rank every query alike")


QUERIES = ["find flights to Rome and a hotel there", "weather forecast tomorrow", "recipes with salmon"]


def test_retriever_answers_repeats_from_the_cache_and_forgets_them_on_a_swap(bm25_versions, serving_data):
    query = differing_query(bm25_versions, QUERIES)
    spaced = "  " + query.replace(" ", "   ") + " "

    async def scenario() -> None:
        retriever = Retriever(serving_data)
        unbatched(retriever, "_retrieve_batch")
        await retriever.reconfigure({"artifact": bm25_versions["default"], "cache_size": 8})
        first = await retriever.retrieve((query, 3))
        again = await retriever.retrieve((spaced, 3))  # same normalised text: a hit
        assert again == first and (await retriever.cache_stats())["hits"] == 1
        alone = RetrieverModel(bm25_versions["default"]).retrieve([query], 3)[0]
        catalog = retriever.catalog
        cv = {"catalog_version": catalog.version}
        top = {"ranking": retriever.model.ranking, "top_score": alone[0][1], "detected": None}
        assert first == {"tools": named(alone, catalog), "version": "bm25/v0001", **cv, **top}
        assert (await retriever.retrieve((query, 2)))["tools"] == first["tools"][:2]  # k is in the key
        assert retriever.cache.stats()["misses"] == 2

        await retriever.reconfigure({"artifact": bm25_versions["lucene"], "cache_size": 8})
        assert len(retriever.cache) == 0
        # A batch that began on the old version may store its answer after the swap: the version
        # in the key keeps it from ever being read.
        retriever.cache.put(("bm25/v0001", retriever.catalog.version, query, 3), first)
        swapped = await retriever.retrieve((query, 3))
        lucene = RetrieverModel(bm25_versions["lucene"]).retrieve([query], 3)[0]
        top = {"ranking": retriever.model.ranking, "top_score": lucene[0][1], "detected": None}
        assert swapped == {"tools": named(lucene, catalog), "version": "bm25/v0002", **cv, **top}
        assert swapped["tools"] != first["tools"]

        await retriever.reconfigure({"artifact": bm25_versions["lucene"], "cache_size": 0})
        await retriever.retrieve((query, 3))
        assert len(retriever.cache) == 0

    asyncio.run(scenario())


def test_the_same_user_config_again_loads_nothing(bm25_versions, serving_data, tmp_path):
    # Ray Serve calls reconfigure with an unchanged user config when only a replica's rank changes
    # (after a scale-down or a replacement): the model was loaded again, two copies in memory and
    # the cache emptied, and a real swap arriving meanwhile could be undone by the stale load.
    async def scenario() -> None:
        retriever = Retriever(serving_data)
        unbatched(retriever, "_retrieve_batch")
        config = {"artifact": bm25_versions["default"], "cache_size": 8}
        await retriever.reconfigure(config)
        model = retriever.model
        await retriever.retrieve((QUERIES[0], 3))
        await retriever.reconfigure(dict(config))  # equal, as Serve sends it again
        assert retriever.model is model and len(retriever.cache) == 1
        # A load that failed (the replica kept serving) is tried again when its config comes back.
        later = {"artifact": str(tmp_path / "v3"), "cache_size": 8}
        await retriever.reconfigure(later)
        assert retriever.model is model
        shutil.copytree(bm25_versions["lucene"], tmp_path / "v3")
        await retriever.reconfigure(dict(later))
        assert retriever.model is not model and len(retriever.cache) == 0

    asyncio.run(scenario())


def test_detector_caches_by_version_too(bm25_versions, serving_data):
    good = {"artifact": bm25_versions["default"], "detector_file": bm25_versions["detector_file"]}

    async def scenario() -> None:
        detector = Detector()
        unbatched(detector, "_detect_batch")
        await detector.reconfigure({**good, "cache_size": 4})
        first = await detector.detect("weather  forecast tomorrow")
        assert await detector.detect("weather forecast tomorrow ") == first
        assert detector.cache.stats()["hits"] == 1
        model = DetectorModel(good["artifact"], good["detector_file"])
        expected = model.probabilities(["weather forecast tomorrow"])
        assert first["probability"] == pytest.approx(expected[0]) and first["version"] == "bm25/v0001"
        await detector.reconfigure({**good, "artifact": bm25_versions["lucene"], "cache_size": 4})
        assert len(detector.cache) == 0
        assert (await detector.detect("weather forecast tomorrow"))["version"] == "bm25/v0002"

    asyncio.run(scenario())


def test_an_answer_begun_before_a_clear_is_not_stored_after_it():
    cache: AnswerCache[str] = AnswerCache(4)
    began = cache.generation
    cache.clear()  # a new model loaded while the answer was being computed
    cache.put("q", "old model's answer", began)
    assert len(cache) == 0
    cache.put("q", "new model's answer", cache.generation)
    assert cache.get("q") == "new model's answer"


def test_a_detection_in_flight_during_a_reload_under_the_same_version_is_not_cached(
    bm25_versions, serving_data
):
    # Reloading the same directory (a recalibration, another encoder runtime) keeps the version
    # string: only the load itself tells the old model's in-flight answer from the new one's.
    good = {"artifact": bm25_versions["default"], "detector_file": bm25_versions["detector_file"]}

    async def scenario() -> None:
        detector = Detector()
        unbatched(detector, "_detect_batch")
        await detector.reconfigure({**good, "cache_size": 4})
        answer_now = detector._detect_batch

        async def reloaded_midway(query):
            answer = await answer_now(query)  # computed by the model loaded first
            # Same version string, new load (another encoder runtime; the same config again loads
            # nothing: test_the_same_user_config_again_loads_nothing).
            await detector.reconfigure({**good, "cache_size": 4, "encoder_runtime": "torch"})
            return answer

        detector._detect_batch = reloaded_midway
        first = await detector.detect("weather forecast tomorrow")
        assert first["version"] == "bm25/v0001" and len(detector.cache) == 0
        detector._detect_batch = answer_now
        assert await detector.detect("weather forecast tomorrow") == first
        assert len(detector.cache) == 1  # an answer of the model now loaded is stored

    asyncio.run(scenario())
