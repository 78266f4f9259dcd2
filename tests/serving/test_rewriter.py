"""The query-rewriting slot: pass-through, history, and a causal-LM rewriter loaded from a dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)

from components.serving.rewriter import (
    HistoryRewriter,
    LMRewriter,
    PassThrough,
    QueryGenRewriter,
    build_rewriter,
)


def test_passthrough_and_history():
    assert build_rewriter(None).rewrite("weather?", ["Paris"]) == "weather?"
    assert isinstance(build_rewriter({"backend": "passthrough"}), PassThrough)
    rewriter = build_rewriter({"backend": "history", "turns": 2})
    assert isinstance(rewriter, HistoryRewriter)
    assert (
        rewriter.rewrite("and there?", ["a", "flying to Rome", "tomorrow"])
        == "flying to Rome tomorrow and there?"
    )
    assert HistoryRewriter(0).rewrite("q", ["a"]) == "q"
    with pytest.raises(ValueError, match="unknown rewriter"):
        build_rewriter({"backend": "nope"})


def test_lm_rewriter_generates_from_a_saved_causal_lm(selector_lm):
    rewriter = build_rewriter({"backend": "lm", "model": selector_lm[0], "max_new_tokens": 8})
    assert isinstance(rewriter, LMRewriter)
    from components.generative.generate import generate_texts

    query = "weather forecast in Paris"
    for history in (["I am flying to France"], []):
        # The greedy first line the LM continues the prompt with, the last turn of history in it.
        prompt = rewriter.prompt.format(history=" ".join(history[-1:]), query=query)
        ((expected,),) = generate_texts(rewriter.model, rewriter.tokenizer, [prompt], 8)
        assert expected  # the LM writes something here: the test is not of the empty fallback
        assert rewriter.rewrite(query, history) == expected


@pytest.fixture
def querygen_artifact(selector_lm, tmp_path) -> str:
    """A query-generation artifact's serving half: its generator (a small trained LM) and the
    system prompt it is prompted with (``config.json``)."""
    from components.methods.base import write_config

    path = tmp_path / "querygen"
    shutil.copytree(selector_lm[0], path / "generator")
    write_config(
        str(path), {"method": "querygen", "params": {"system_prompt": "Search query:", "max_new_tokens": 8}}
    )
    return str(path)


def test_a_querygen_artifact_is_not_served_behind_a_querygen_rewriter(
    querygen_artifact, bm25_versions, serving_data
):
    # It rewrites each query itself: the rewriter would rewrite the rewrite (and its RRF would fuse
    # the rewrite, not the user's words, with the generated query).
    from components.serving.app import ServeArgs, user_configs

    rewriter = {"backend": "querygen", "path": querygen_artifact}
    args = {"catalog": serving_data, "detector_file": bm25_versions["detector_file"], "rewriter": rewriter}
    with pytest.raises(ValueError, match="is a querygen method, which rewrites queries itself"):
        user_configs(ServeArgs.model_validate({**args, "artifact": querygen_artifact}))
    # Its retriever with the rewriter in front is the way to rewrite in a deployment of its own.
    assert user_configs(ServeArgs.model_validate({**args, "artifact": bm25_versions["default"]}))[
        "QueryRewriter"
    ]


def test_the_querygen_rewriter_takes_querygen_artifacts_and_says_what_it_does_not_fuse(
    querygen_artifact, bm25_versions, caplog
):
    # A BM25 artifact failed with "unexpected keyword argument" from the params' constructor.
    with pytest.raises(ValueError, match=r"a 'bm25' artifact; the querygen rewriter takes one trained"):
        QueryGenRewriter(bm25_versions["default"])
    # An artifact that chose RRF on valid retrieves worse with its rewrite alone: said, once.
    config = json.loads((Path(querygen_artifact) / "config.json").read_text())
    (Path(querygen_artifact) / "config.json").write_text(json.dumps({**config, "fusion": "rrf"}))
    with caplog.at_level("WARNING", logger="components.serving.rewriter"):
        QueryGenRewriter(querygen_artifact)
    assert "chose fusion 'rrf' on valid; as a rewriter only its rewrite is searched" in caplog.text


def test_querygen_rewriter_batches_and_matches_one_by_one(querygen_artifact):
    rewriter = build_rewriter({"backend": "querygen", "path": querygen_artifact})
    assert isinstance(rewriter, QueryGenRewriter)
    requests = [("weather forecast in Paris", []), ("cheap flights to Rome", ["I live in Oslo"])]
    batch = rewriter.rewrite_many(requests)
    assert batch == [rewriter.rewrite(q, h) for q, h in requests]
    assert all(isinstance(t, str) and t.strip() and "\n" not in t for t in batch)


def test_the_deployment_falls_back_to_the_query_on_timeout_and_caches_rewrites(
    querygen_artifact, serve_instance
):
    from ray import serve

    from components.serving.deployments import QueryRewriter

    query, other = "weather forecast in Paris", "recipes with salmon"
    expected = QueryGenRewriter(querygen_artifact).rewrite(query, [])
    assert expected != query

    def config(timeout_s: float) -> dict:
        return {"backend": "querygen", "path": querygen_artifact, "timeout_s": timeout_s}

    app = serve.deployment(QueryRewriter).options(user_config=config(1e-9)).bind()
    handle = serve.run(app, name="rewriter-test", route_prefix=None)
    try:
        # No generator answers within a nanosecond: the request goes on with its own words, so the
        # retriever answers exactly as for the original query.
        assert handle.rewrite.remote(query, []).result() == query
        # A new user config as Serve hands it to the running replica: only the timeout changes, so
        # the model stays loaded and the cache is kept.
        handle.reconfigure.remote(config(120)).result()
        assert handle.rewrite.remote(query, []).result() == expected
        handle.reconfigure.remote(config(1e-9)).result()
        assert handle.rewrite.remote(query, []).result() == expected  # from the cache
        assert handle.rewrite.remote(other, []).result() == other  # not cached: falls back
    finally:
        serve.delete("rewriter-test")


def test_a_failing_generator_answers_with_the_query_and_caches_nothing():
    import asyncio

    from components.serving.deployments import QueryRewriter

    class EndpointDown:
        def rewrite(self, query, history):
            raise ConnectionError("chat endpoint refused the connection")

        def rewrite_many(self, items):
            raise ConnectionError("chat endpoint refused the connection")

    async def scenario() -> None:
        deployment = QueryRewriter()
        await deployment.reconfigure({"backend": "history", "turns": 1})
        deployment.rewriter = EndpointDown()  # the generator of a querygen endpoint that went down
        body = type(deployment)._rewrite_batch.__wrapped__

        async def one(item):
            return (await body(deployment, [item]))[0]

        deployment._rewrite_batch = one
        assert await deployment.rewrite("weather in Paris", ["hello"]) == "weather in Paris"
        assert len(deployment.cache) == 0  # the next request tries the generator again

    asyncio.run(scenario())


def test_a_rewrite_past_its_timeout_stops_decoding_instead_of_holding_the_cores(selector_lm):
    import asyncio
    import threading
    import time

    from components.generative.deadline import DeadlinePassed
    from components.serving.deployments import QueryRewriter

    query, steps = "weather forecast in Paris", 40

    async def scenario() -> tuple[object, int]:
        deployment = QueryRewriter()
        config = {"backend": "lm", "model": selector_lm[0], "max_new_tokens": steps, "timeout_s": 0.2}
        await deployment.reconfigure(config)
        rewriter = deployment.rewriter
        rewriter.tokenizer.eos_token_id = None  # no early end: it decodes all `steps` unless stopped
        rewriter.model.generation_config.eos_token_id = None
        passes: list[int] = []

        def slow(module, args, output):  # each forward pass 50 ms: 40 of them take 2 s or more
            passes.append(1)
            time.sleep(0.05)

        rewriter.model.register_forward_hook(slow)
        ended, outcome = threading.Event(), []
        rewrite_many = rewriter.rewrite_many

        def watched(requests):  # what the decoding thread did after the request was answered
            try:
                outcome.append(rewrite_many(requests))
            except Exception as e:
                outcome.append(e)
                raise
            finally:
                ended.set()

        rewriter.rewrite_many = watched
        body = type(deployment)._rewrite_batch.__wrapped__  # the batch body, without Serve

        async def one(item):
            return (await body(deployment, [item]))[0]

        deployment._rewrite_batch = one
        assert await deployment.rewrite(query, []) == query  # answered at the timeout
        assert await asyncio.to_thread(ended.wait, 120)
        return outcome[0], len(passes)

    outcome, passes = asyncio.run(scenario())
    # The thread stopped at the timeout too, rather than decode to the end an answer nobody reads.
    assert isinstance(outcome, DeadlinePassed) and passes < steps
