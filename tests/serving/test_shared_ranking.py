"""One ranking for detection and retrieval: when the Detector thresholds the top score of the very
artifact the Retriever serves, the ingress ranks a query once (by the Retriever) and the Detector
reads the score it returns, instead of ranking the query a second time. The real Ingress, Detector
and Retriever classes with real BM25 artifacts, in this process (``Local`` stands in for Serve's
handles: the transport, not the behaviour; test_live_updates.py runs the same path over Serve)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import unbatched

from components.serving.deployments import Detector
from components.serving.ingress import Ingress
from components.serving.models import DetectorModel, RetrieverModel, named
from components.serving.retriever_deployment import Retriever
from components.serving.schemas import SelectRequest


class Local:
    """A deployment object behind the handle interface the Ingress calls (``handle.m.remote(*a)``)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.target, name)
        return SimpleNamespace(remote=lambda *args: method(*args))


async def graph(serving_data: str, detector_config: dict, retriever_artifact: str, rewriter=None, **options):
    detector, retriever = Detector(), Retriever(serving_data)
    unbatched(detector, "_detect_batch")
    unbatched(retriever, "_retrieve_batch")
    await detector.reconfigure(detector_config)
    await retriever.reconfigure({"artifact": retriever_artifact})
    ingress = Ingress(Local(detector), Local(retriever), rewriter=rewriter, **options)
    return ingress, detector, retriever


def ask(ingress: Ingress, query: str, **request: Any) -> Any:
    return ingress.answer(SelectRequest(query=query, top_k=3, **request))


def test_a_score_threshold_detector_of_the_served_artifact_reads_the_retrievers_score(
    bm25_versions, serving_data, dataset
):
    good = {"artifact": bm25_versions["default"], "detector_file": bm25_versions["detector_file"]}
    alone = DetectorModel(good["artifact"], good["detector_file"])
    ranker = RetrieverModel(good["artifact"])
    assert alone.reads_ranking_of == ranker.ranking  # it thresholds this artifact's top score
    queries = list(dataset.split_queries("test").values())[:12] + list(dataset.neg_split["test"])[:8]
    assert len(queries) == 20

    async def scenario() -> None:
        ingress, detector, retriever = await graph(serving_data, good, good["artifact"])
        answers = [await ask(ingress, q) for q in queries]
        # The first request learns that the two serve one artifact (the detector ranked it); every
        # later one was ranked once, by the Retriever: the Detector's own path never ran again.
        assert detector.cache.stats()["misses"] == 1
        assert retriever.cache.stats()["misses"] == len(queries)
        # The answers are those of detection and retrieval run apart.
        probabilities = alone.probabilities(queries)
        for query, answer, p in zip(queries, answers, probabilities, strict=True):
            assert answer["probability"] == pytest.approx(p, abs=1e-12)
            assert answer["needs_tool"] == (p >= alone.decision_threshold)
            tools = named(ranker.retrieve([query], 3)[0], retriever.catalog) if answer["needs_tool"] else []
            assert answer["tools"] == tools
            assert answer["versions"] == {
                "detector": "bm25/v0001",
                "retriever": "bm25/v0001" if answer["needs_tool"] else None,
            }
        assert {a["needs_tool"] for a in answers} == {True, False}  # both branches were answered

    asyncio.run(scenario())


def test_a_detector_of_another_artifact_behind_a_rewriter_or_turned_off_ranks_the_query_itself(
    bm25_versions, serving_data
):
    default, lucene = bm25_versions["default"], bm25_versions["lucene"]
    config = {"artifact": default, "detector_file": bm25_versions["detector_file"]}
    queries = ["find flights to Rome and a hotel there", "weather forecast tomorrow", "recipes with salmon"]

    class Echo:  # a rewriter that leaves the text as it is: still, the retrieved text could differ
        async def rewrite(self, query: str, history: list[str]) -> str:
            return query

    async def each_ranked_twice(ingress, detector, retriever) -> None:
        for q in queries:  # every query needs a tool (threshold 0): each one is retrieved
            assert (await ask(ingress, q, needs_tool_threshold=0.0))["needs_tool"]
        assert detector.cache.stats()["misses"] == retriever.cache.stats()["misses"] == len(queries)

    async def scenario() -> None:
        # Detection pinned to v0001 while retrieval serves v0002: never fused.
        await each_ranked_twice(*await graph(serving_data, config, lucene))
        # The same artifact behind a rewriter: the retrieved text is the rewrite, not the query.
        await each_ranked_twice(*await graph(serving_data, config, default, rewriter=Local(Echo())))
        # Turned off (app arg share_ranking: false): each query ranked by both.
        await each_ranked_twice(*await graph(serving_data, config, default, share_ranking=False))

    asyncio.run(scenario())


def test_a_detector_swapped_between_the_two_calls_detects_with_its_own_model(bm25_versions, serving_data):
    default, lucene = bm25_versions["default"], bm25_versions["lucene"]
    config = {"artifact": default, "detector_file": bm25_versions["detector_file"]}
    query = "weather forecast tomorrow"

    async def scenario() -> None:
        ingress, detector, retriever = await graph(serving_data, config, default)
        # Learns that the two rank alike (the first query is retrieved: threshold 0).
        await ask(ingress, "find flights to Rome and a hotel there", needs_tool_threshold=0.0)
        await detector.reconfigure({**config, "artifact": lucene})  # lands before the next request
        answer = await ask(ingress, query)
        assert retriever.cache.stats()["misses"] == 2  # this query was ranked by the Retriever first
        # The score the Retriever sent is v0001's: v0002's detector ranked the query itself.
        expected = DetectorModel(lucene, bm25_versions["detector_file"]).probabilities([query])[0]
        assert answer["probability"] == pytest.approx(expected, abs=1e-12)
        assert answer["versions"]["detector"] == "bm25/v0002"
        assert detector.cache.stats()["misses"] == 2  # the first request's, and this one's

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def masstool_artifact(trained_masstool, tmp_path_factory) -> str:
    """The session's MassTool (trained on Ray Train, tests/conftest.py), saved as an artifact."""
    path = str(tmp_path_factory.mktemp("shared") / "masstool" / "v0001")
    trained_masstool[0].save(path)
    return path


def test_masstools_own_detector_decides_from_the_pass_that_ranked_the_query(
    masstool_artifact, with_negatives_dir, with_negatives
):
    local = RetrieverModel(masstool_artifact).method  # the artifact as one process loads it
    queries = list(with_negatives.split_queries("test").values())[:6] + with_negatives.neg_split["test"][:6]

    async def scenario() -> None:
        config = {"artifact": masstool_artifact}  # a method with detect() needs no calibration
        ingress, detector, retriever = await graph(str(with_negatives_dir), config, masstool_artifact)
        answers = [await ask(ingress, q) for q in queries]
        # The detection tower ran in the Detector once (the first request); after that in the
        # Retriever's pass, the one that ranked the query.
        assert detector.cache.stats()["misses"] == 1
        assert retriever.cache.stats()["misses"] == len(queries)
        expected = local.detect({str(i): q for i, q in enumerate(queries)})
        for i, (query, answer) in enumerate(zip(queries, answers, strict=True)):
            assert answer["probability"] == pytest.approx(expected[str(i)], abs=1e-5)
            assert answer["needs_tool"] == (answer["probability"] >= local.detect_threshold)
            want = list(local.retrieve({"q": query}, 3)["q"]) if answer["needs_tool"] else []
            assert [t["id"] for t in answer["tools"]] == want
        assert {a["needs_tool"] for a in answers} == {True, False}

    asyncio.run(scenario())


def test_a_retriever_that_fails_first_fails_no_query_that_needs_no_tool(bm25_versions, serving_data):
    config = {"artifact": bm25_versions["default"], "detector_file": bm25_versions["detector_file"]}

    class Down:
        calls = 0

        async def retrieve(self, request):
            Down.calls += 1
            raise RuntimeError("retriever down")

    async def scenario() -> None:
        ingress, _, _ = await graph(serving_data, config, bm25_versions["default"])
        await ask(ingress, "find flights to Rome and a hotel there", needs_tool_threshold=0.0)
        ingress.retriever = Local(Down())  # the ingress now ranks in the Retriever first
        out = await ask(ingress, "hello there", needs_tool_threshold=1.0)  # needs no tool
        assert Down.calls == 1  # asked first, and failed
        assert out["needs_tool"] is False and out["versions"]["retriever"] is None
        # Until a retrieval succeeds it detects first again: no Retriever call for no tool needed.
        assert (await ask(ingress, "good morning", needs_tool_threshold=1.0))["needs_tool"] is False
        assert Down.calls == 1
        with pytest.raises(RuntimeError, match="retriever down"):  # one that needs a tool cannot be answered
            await ask(ingress, "weather forecast tomorrow", needs_tool_threshold=0.0)

    asyncio.run(scenario())


def test_a_detector_that_cannot_read_the_answer_detects_alone_and_an_unavailable_one_fails(
    bm25_versions, serving_data
):
    from components.serving.ingress import BackendUnavailable

    config = {"artifact": bm25_versions["default"], "detector_file": bm25_versions["detector_file"]}
    query = "weather forecast tomorrow"

    class Older:  # a Detector replica from before detect_scored (mid-rollout)
        def __init__(self, detector: Detector) -> None:
            self.detect = detector.detect

    class Unavailable(Older):
        async def detect_scored(self, *answer):
            raise BackendUnavailable("a model deployment did not answer after 4 tries; try again")

    async def scenario() -> None:
        ingress, detector, retriever = await graph(serving_data, config, bm25_versions["default"])
        await ask(ingress, "find flights to Rome and a hotel there", needs_tool_threshold=0.0)
        ingress.detector = Local(Older(detector))
        out = await ask(ingress, query, needs_tool_threshold=0.0)
        assert out["needs_tool"] and out["tools"]  # detected alone, retrieved once (the first pass)
        assert detector.cache.stats()["misses"] == 2 and retriever.cache.stats()["misses"] == 2
        expected = DetectorModel(config["artifact"], config["detector_file"]).probabilities([query])[0]
        assert out["probability"] == pytest.approx(expected, abs=1e-12)
        ingress.detector = Local(Unavailable(detector))
        with pytest.raises(BackendUnavailable):  # down is down: not hidden behind a second try
            await ask(ingress, "recipes with salmon")

    asyncio.run(scenario())


def test_the_ranking_key_tells_runtimes_apart_where_they_move_the_scores(
    bm25_versions, trained_dense, tmp_path
):
    from components.methods import method_class
    from components.serving.models import ranking_key

    dense = str(tmp_path / "dense" / "v0001")
    trained_dense[0].save(dense)
    assert ranking_key(dense, "torch", None) != ranking_key(dense, "onnx", None)
    bm25 = bm25_versions["default"]
    assert ranking_key(bm25, "torch", None) == ranking_key(bm25, "onnx", None)  # no encoder to move
    assert ranking_key(bm25, "torch", None) != ranking_key(bm25_versions["lucene"], "torch", None)
    # A threshold never reads the top score of a ranking that depends on k (beams, fused depth).
    for name in ("toolgen", "toolweaver", "querygen"):
        assert "exact_scores" not in method_class(name).capabilities
    for name in ("bm25", "dense", "masstool"):
        assert "exact_scores" in method_class(name).capabilities


def test_the_load_benchmarks_in_process_baseline_shares_the_ranking_where_the_graph_does(bm25_versions):
    from benchmarks.serve_load import shares_ranking

    default, lucene = bm25_versions["default"], bm25_versions["lucene"]
    detector = DetectorModel(default, bm25_versions["detector_file"])
    assert shares_ranking(detector, RetrieverModel(default), None)
    assert not shares_ranking(detector, RetrieverModel(lucene), None)
    assert not shares_ranking(detector, RetrieverModel(default), rewriter=object())


def test_tied_tools_are_served_in_the_order_evaluation_scored():
    # Evaluation and serving both keep equal scores in the method's order (BM25: catalog position,
    # the order its own cut keeps): on a tie the list served is the list scored.
    from components.metrics import ranked

    scores = {"2": 1.0, "10": 1.0, "7": 3.0, "1": 0.5}  # method order: catalog position
    served = RetrieverModel._rankings({"0": scores}, 1, 3)[0]
    assert [t for t, _ in served] == ranked(scores, 3) == ["7", "2", "10"]
