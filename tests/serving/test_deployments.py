"""The deployments' batch semantics, failed hot-swaps, pinned versions, and the ingress's error and
API-key layer: in-process with real artifacts, then one batch over Serve."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from functools import partial
from pathlib import Path

import pytest
import requests
from fastapi import FastAPI
from fastapi.testclient import TestClient
from local_openai_server import LocalChatServer
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import deploy, half_written, private_registry

from components.serving.app import ServeArgs, user_configs
from components.serving.batch_calls import call_each, rank_by_k
from components.serving.deploy import check_config, deploy_config, serve_config
from components.serving.deployments import Detector, Selector, select_all
from components.serving.errors import API_KEY_ENV, ApiKeyMiddleware, install_error_handlers
from components.serving.ingress import PUBLIC_PATHS
from components.serving.models import RetrieverModel
from components.serving.retriever_deployment import Retriever
from components.serving.selector_http import OpenAISelector
from components.serving.selector_lm import LMSelector
from components.serving.swap import swap_artifact


class BeamRetriever:
    """Retrieval by trie-constrained beam search with k beams (as ToolWeaver's multi-token codes
    are decoded) on a tiny seeded LM: the project's decoder, whose top k is not always the first k
    of its top K (fewer beams prune other paths)."""

    def __init__(self) -> None:
        import random

        from generative.tiny_lm import tiny_lm  # tests/generative, a namespace package on the path

        from components.generative.targeted import TargetedLM
        from components.generative.trie import TokenTrie

        lm, self.tokenizer, _ = tiny_lm(seed=1, tools=False)
        self.lm, self.trie, rng, codes = TargetedLM(lm), TokenTrie(), random.Random(0), set()
        while len(codes) < 40:
            codes.add(tuple(rng.randrange(5, 290) for _ in range(3)))
        for i, code in enumerate(sorted(codes)):
            self.trie.insert(list(code), str(i))

    def retrieve(self, texts: list[str], k: int) -> list[list[tuple[str, float]]]:
        from components.generative.constrained import constrained_top_k

        prompts = [self.tokenizer(t)["input_ids"] for t in texts]
        hits = constrained_top_k(self.lm, prompts, self.trie, k, self.tokenizer.pad_token_id)
        return [list(found) for found in hits]


@pytest.fixture(scope="module")
def dense(duplicated_dense) -> RetrieverModel:
    return RetrieverModel(duplicated_dense["artifact"])


@pytest.fixture(scope="module")
def tiny_queries(duplicated_dense) -> list[str]:
    with open(Path(duplicated_dense["data"]) / "queries.jsonl") as f:
        return [json.loads(line)["text"] for line in f]


def same(ranked: list, alone: list) -> bool:
    """Same tools in the same order; scores equal up to float noise (padding within a batch)."""
    return [t for t, _ in ranked] == [t for t, _ in alone] and [s for _, s in ranked] == pytest.approx(
        [s for _, s in alone], abs=1e-5
    )


def test_each_k_is_ranked_as_if_alone():
    model = BeamRetriever()
    query, k, big = "weather in paris", 1, 10
    batch = [(query, k), (query, big), ("hotel in berlin", k)]
    alone = [model.retrieve([text], n)[0] for text, n in batch]
    assert all(same(r, a) for r, a in zip(rank_by_k(model.retrieve, batch), alone, strict=True))
    assert not same(alone[1][:k], alone[0])  # what ranking the batch once at its largest k answered


def test_a_failing_item_fails_only_itself(dense):
    # A lone surrogate: the HTTP schema rejects it, but a model call can meet any text; the HF fast
    # tokenizer raises TypeError on it, which used to fail every request of the batch.
    texts = ["weather in Paris", "\ud800", "hotel in Berlin"]
    results = call_each(partial(dense.retrieve, k=3), texts)
    assert same(results[0], dense.retrieve([texts[0]], 3)[0]) and same(
        results[2], dense.retrieve([texts[2]], 3)[0]
    )
    assert isinstance(results[1], TypeError)
    ranked = rank_by_k(dense.retrieve, [("weather in Paris", 2), ("\ud800", 2)])
    assert same(ranked[0], dense.retrieve(["weather in Paris"], 2)[0]) and isinstance(ranked[1], TypeError)


def test_a_model_server_that_does_not_answer_fails_the_batch_once_not_item_by_item():
    # An LM engine behind HTTP (vLLM) that refuses or times out fails every item alike; retried one
    # by one, a batch of n waited n + 1 timeouts while the replica's batch slot stayed taken.
    import socket

    from components.generative.chat_endpoint import EndpointUnavailable, post_chat_completion

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    calls: list[int] = []

    def score(items: list[str]) -> list[str]:
        calls.append(len(items))
        post_chat_completion(f"http://127.0.0.1:{port}/v1/chat/completions", {"messages": []}, None, 2.0)
        return items

    results = call_each(score, ["a", "b", "c", "d"])
    assert calls == [4] and all(isinstance(r, EndpointUnavailable) for r in results)


def test_a_failed_swap_keeps_the_serving_model(bm25_versions, serving_data, tmp_path, caplog):
    broken = half_written(tmp_path)
    retriever, detector = Retriever(serving_data), Detector()
    good = {"artifact": bm25_versions["default"], "detector_file": bm25_versions["detector_file"]}
    asyncio.run(retriever.reconfigure({"artifact": good["artifact"], "max_batch_size": 4}))
    asyncio.run(detector.reconfigure(good))
    with caplog.at_level(logging.ERROR, logger="ray.serve"):
        asyncio.run(retriever.reconfigure({"artifact": broken}))
        asyncio.run(detector.reconfigure({**good, "artifact": broken}))
    assert retriever.model is not None and retriever.model.version == "bm25/v0001"
    assert detector.model is not None and detector.model.version == "bm25/v0001"
    assert "still serving the previous one" in caplog.text and "KeyError" in caplog.text
    # A later good swap still lands.
    asyncio.run(retriever.reconfigure({"artifact": bm25_versions["lucene"]}))
    assert retriever.model.version == "bm25/v0002"
    # Nothing to fall back on: the first load fails loudly, as Serve needs to see.
    with pytest.raises(KeyError):
        asyncio.run(Retriever(serving_data).reconfigure({"artifact": broken}))
    with pytest.raises(KeyError):
        asyncio.run(Detector().reconfigure({**good, "artifact": broken}))


@pytest.mark.parametrize(
    "bad, says",
    [
        ({}, "artifact"),  # left out of a hand-written user config
        ({"cache_size": -1}, "cache_size"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"batch_wait_timeout_s": -0.1}, "batch_wait_timeout_s"),
    ],
)
def test_a_bad_hand_written_user_config_is_refused_and_the_model_kept(
    bad, says, bm25_versions, serving_data, caplog
):
    # These raised outside the guarded load (KeyError, the cache's or batching's ValueError): Serve
    # marked the replica failed, and a config the docs tell operators to write took it down.
    retriever, detector = Retriever(serving_data), Detector()
    good = {"artifact": bm25_versions["default"], "detector_file": bm25_versions["detector_file"]}
    asyncio.run(retriever.reconfigure({"artifact": good["artifact"]}))
    asyncio.run(detector.reconfigure(good))
    config = {**good, **bad} if bad else {"detector_file": good["detector_file"]}
    with caplog.at_level(logging.ERROR, logger="ray.serve"):
        asyncio.run(retriever.reconfigure(config))
        asyncio.run(detector.reconfigure(config))
    assert retriever.model is not None and retriever.model.version == "bm25/v0001"
    assert detector.model is not None and detector.model.version == "bm25/v0001"
    assert "Retriever: bad user config" in caplog.text and says in caplog.text
    # A replica's first config: nothing to keep serving, so Serve must see it fail.
    with pytest.raises(ValueError, match=f"Detector: bad user config(.|\\n)*{says}"):
        asyncio.run(Detector().reconfigure(config))


def test_a_failed_selector_swap_keeps_its_backend(serving_data):
    selector = Selector(serving_data)
    asyncio.run(selector.reconfigure({"backend": "none"}))  # no backend is a configuration too
    asyncio.run(selector.reconfigure({"backend": "nope"}))
    assert selector.configured and selector.backend is None
    # A real backend (built without connecting) is kept, the same object, through a failed swap.
    asyncio.run(selector.reconfigure({"backend": "openai", "url": "http://127.0.0.1:9/v1", "model": "m"}))
    before = selector.backend
    assert before is not None
    asyncio.run(selector.reconfigure({"backend": "nope"}))
    assert selector.backend is before
    with pytest.raises(ValueError, match="unknown selector backend"):
        asyncio.run(Selector(serving_data).reconfigure({"backend": "nope"}))


def test_the_champion_is_pinned_when_user_configs_are_built(bm25_versions, serving_data, tmp_path):
    registry = private_registry(bm25_versions, tmp_path)
    args = ServeArgs(
        artifact="models:/bm25@champion", catalog=serving_data, registry=registry.settings.as_config()
    )
    configs = user_configs(args)
    assert configs["Retriever"]["artifact"] == str(tmp_path / "registry" / "versions" / "bm25" / "v2")
    assert configs["Detector"]["artifact"] == configs["Retriever"]["artifact"]
    assert configs["Retriever"]["source"] == configs["Detector"]["source"] == "models:/bm25/2"
    registry.rollback("bm25")  # the champion moves back to v1 while replicas run
    # A replica started now (autoscaling, a crash replacement) loads what its peers loaded.
    assert RetrieverModel(configs["Retriever"]["artifact"]).version == "bm25/v2"
    # A replica on another node, where the pinned directory was never materialised, materialises
    # the same version from the registry (not the champion of now).
    os.unlink(configs["Retriever"]["artifact"])  # a link to the logged files, for this registry
    keys = ("source", "registry")
    elsewhere = RetrieverModel(configs["Retriever"]["artifact"], **{k: configs["Retriever"][k] for k in keys})
    assert elsewhere.version == "bm25/v2" and os.path.isdir(configs["Retriever"]["artifact"])
    # A swap to the URI builds the configs again and pins the new champion.
    assert user_configs(args)["Retriever"]["artifact"].endswith("/bm25/v1")
    # An alias the registry lacks is refused before any replica sees it.
    with pytest.raises(ValueError, match="no alias 'challenger'"):
        user_configs(args.model_copy(update={"artifact": "models:/bm25@challenger"}))


def test_a_pinned_detector_whose_alias_is_gone_blocks_no_swap(bm25_versions, serving_data, tmp_path):
    # The pinned Detector is never moved by a swap, but its URI was resolved again on each one: once
    # its alias was removed, every follow and catalog refresh failed on "no alias".
    registry = private_registry(bm25_versions, tmp_path)
    args = {
        "artifact": bm25_versions["default"],
        "detector_artifact": "models:/bm25@champion",
        "detector_file": bm25_versions["detector_file"],
        "catalog": serving_data,
        "registry": registry.settings.as_config(),
    }
    # The shipped config file lists the Detector's options (no user config) among its deployments.
    from workflows.serve import read_serve_config

    shipped = serve_config(args, read_serve_config(None))
    check_config(shipped)  # built from the args: the alias is resolved
    first = swap_artifact(shipped, bm25_versions["lucene"])
    registry.set_alias("bm25", "champion", None)
    with pytest.raises(ValueError, match="no alias 'champion'"):
        check_config(shipped)  # a new build still needs it
    again = swap_artifact(first, bm25_versions["default"])
    deployments = {d["name"]: d for d in again["applications"][0]["deployments"]}
    assert deployments["Retriever"]["user_config"]["artifact"] == bm25_versions["default"]
    assert "user_config" not in deployments["Detector"]  # not redeployed
    check_config(again)  # what deploy_config checks before the swap


def test_bad_artifacts_are_refused_on_the_driver(bm25_versions, serving_data, tmp_path):
    args = {"artifact": bm25_versions["default"], "catalog": serving_data}
    config = serve_config(args)
    (tmp_path / "empty").mkdir()
    (tmp_path / "not_json").mkdir()
    (tmp_path / "not_json" / "config.json").write_text("{")
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text(json.dumps({"method": "nope"}))
    cases = {
        "missing": "is not a directory",
        "empty": "no config.json",
        "not_json": "cannot read its config.json",
        "unknown": "unknown method 'nope'",
    }
    for name, message in cases.items():
        with pytest.raises(ValueError, match=message):
            swap_artifact(config, str(tmp_path / name))
    # deploy_config checks before it deploys anything (no Serve is running in this test).
    with pytest.raises(ValueError, match="is not a directory"):
        deploy_config(serve_config({**args, "artifact": str(tmp_path / "missing")}))
    with pytest.raises(ValueError, match=r"catalog .*missing.*: cannot read its corpus"):
        deploy_config(serve_config({**args, "catalog": str(tmp_path / "missing")}))
    swapped = swap_artifact(config, bm25_versions["lucene"])["applications"][0]["deployments"]
    assert {d["name"]: d["user_config"]["artifact"] for d in swapped} == {
        "Retriever": bm25_versions["lucene"],
        "Detector": bm25_versions["lucene"],
    }


def test_a_selector_timeout_past_its_deadline_is_refused_on_the_driver(bm25_versions, serving_data):
    # The deployment stops waiting at deadline_s (30 s by default), so serve_config_llm.yaml's
    # timeout_s: 60 never took effect: calls of 30-60 s came back as none.
    args = {"artifact": bm25_versions["default"], "catalog": serving_data}
    selector = {"backend": "openai", "url": "http://127.0.0.1:9/v1", "model": "m", "timeout_s": 60}
    with pytest.raises(ValueError, match=r"selector\.timeout_s 60 is past selector\.deadline_s 30\.0"):
        deploy_config(serve_config({**args, "selector": selector}))
    user_configs(ServeArgs.model_validate({**args, "selector": {**selector, "deadline_s": 60}}))


def test_http_selector_calls_of_a_batch_run_concurrently(selector_lm, catalog, dataset):
    delay = 1.0
    query = next(iter(dataset.split_queries("test").values()))
    asks = [{"query": query, "history": [], "candidates": list(catalog.tools)[i : i + 3]} for i in range(4)]
    with LocalChatServer(LMSelector(selector_lm[0], catalog), delay_s=delay) as server:
        backend = OpenAISelector(server.url, "m", catalog)
        calls = asyncio.run(select_all(backend, asks))
    assert all(c is not None and c["tool"] in a["candidates"] for c, a in zip(calls, asks, strict=True))
    # The concurrency itself, counted by the server: all four were in flight at once (one after
    # the other would never have more than one). The delay only keeps each call open long enough.
    assert server.max_in_flight == len(asks)


def test_the_selector_answers_none_past_its_deadline_and_a_call_within_it(
    selector_lm, catalog, dataset, serving_data, serve_instance
):
    from ray import serve

    query = next(iter(dataset.split_queries("test").values()))
    ask = {"query": query, "history": [], "candidates": list(catalog.tools)[:3]}

    def config(deadline_s: float) -> dict:
        return {"backend": "lm", "model": selector_lm[0], "deadline_s": deadline_s}

    app = serve.deployment(Selector).options(user_config=config(1e-9)).bind(serving_data)
    handle = serve.run(app, name="selector-test", route_prefix=None)
    try:
        # No decode ends within a nanosecond: no call, so the ingress answers with the ranking.
        assert handle.select.remote(ask).result() is None
        handle.reconfigure.remote(config(120)).result()  # only the deadline changes
        call = handle.select.remote(ask).result()
        assert call is not None and call["tool"] in ask["candidates"]
    finally:
        serve.delete("selector-test")


def guarded_app() -> FastAPI:
    """The ingress's error handlers and API-key middleware around a few routes."""
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(ApiKeyMiddleware, public=PUBLIC_PATHS)

    @app.get("/v1/tools")
    async def tools() -> dict:
        return {"size": 1}

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/admin/stats")
    async def stats() -> dict:
        raise RuntimeError("db password is hunter2")

    return app


@pytest.mark.parametrize("root_path", ["", "/tools-api"])
def test_the_api_key_guards_every_path_but_the_public_ones(monkeypatch, root_path):
    monkeypatch.setenv(API_KEY_ENV, "k-9")
    client = TestClient(guarded_app(), root_path=root_path, raise_server_exceptions=False)
    key = {"Authorization": "Bearer k-9"}
    for path in ("/v1/tools", "/admin/stats", "/nope", "/healthz/"):
        r = client.get(root_path + path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", path
    for path in ("/healthz", "/docs", "/openapi.json", "/docs/oauth2-redirect"):
        assert client.get(root_path + path).status_code == 200, path
    assert client.get(root_path + "/v1/tools", headers=key).json() == {"size": 1}
    assert client.get(root_path + "/nope", headers=key).status_code == 404


def test_unexpected_errors_are_json_500s_without_internals(caplog):
    client = TestClient(guarded_app(), raise_server_exceptions=False)
    with caplog.at_level(logging.ERROR, logger="ray.serve"):
        r = client.get("/admin/stats")
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert "hunter2" not in r.text and "Traceback" not in r.text
    assert "hunter2" in caplog.text and "Traceback" in caplog.text  # the server log has it all


def test_a_batch_over_serve_answers_each_request_as_alone(
    serve_instance, duplicated_dense, bm25_versions, dense, tiny_queries
):
    # Copies of each tool tie exactly: each request's answer is its own top k, ties in catalog
    # order, whatever k its batch mate asked for.
    query, k, big = tiny_queries[0], 3, 8
    # Two requests fill a batch; one alone would wait 60 s for a partner, past the client's 30 s
    # timeout: that both are answered at all shows they were batched together (no clock read).
    wait_s = 60.0
    deploy(
        {
            "artifact": duplicated_dense["artifact"],
            "catalog": duplicated_dense["data"],
            "detector_artifact": bm25_versions["default"],
            "detector_file": bm25_versions["detector_file"],
            "batching": {"Retriever": {"max_batch_size": 2, "batch_wait_timeout_s": wait_s}},
        }
    )
    answers: dict[int, dict] = {}

    def ask(top_k: int) -> None:
        body = {"query": query, "top_k": top_k, "needs_tool_threshold": 0.0}
        answers[top_k] = requests.post(f"{serve_instance}/v1/select", json=body, timeout=30).json()

    threads = [threading.Thread(target=ask, args=(n,)) for n in (k, big)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == sorted((k, big)), answers
    for n in (k, big):
        ids = [t["id"] for t in answers[n]["tools"]]
        assert ids == [t for t, _ in dense.retrieve([query], n)[0]], (n, ids)


def test_a_selection_past_its_deadline_stops_decoding(selector_lm, catalog, dataset, serving_data):
    from components.generative.deadline import DeadlinePassed, deadline

    query = next(iter(dataset.split_queries("test").values()))
    ask = {"query": query, "history": [], "candidates": list(catalog.tools)[:3]}
    backend = LMSelector(selector_lm[0], catalog)
    assert backend.select(**ask) is not None  # without a deadline: a call
    with deadline(0.0), pytest.raises(DeadlinePassed):
        backend.select(**ask)
    # The deployment's batch opens the deadline around the decode and answers such a request
    # with no call (the ingress then returns the ranking alone), quietly.
    selector = Selector(serving_data)
    asyncio.run(selector.reconfigure({"backend": "lm", "model": selector_lm[0], "deadline_s": 0.0}))
    body = type(selector)._select_batch.__wrapped__
    assert asyncio.run(body(selector, [ask])) == [None]
    decoded: list[int] = []
    selector.backend.model.register_forward_hook(lambda *args: decoded.append(1))
    assert asyncio.run(body(selector, [ask])) == [None] and not decoded


def test_a_local_lm_selector_answers_each_request_as_soon_as_it_is_decoded(selector_lm, serving_data):
    # Serve answers a batch when all of it is decoded, and a local LM decodes one request after the
    # other: batched, each call would wait for its batch-mates' decodes as well as its own.
    selector = Selector(serving_data)
    batching = {"max_batch_size": 4, "batch_wait_timeout_s": 0.0}
    asyncio.run(selector.reconfigure({"backend": "lm", "model": selector_lm[0], **batching}))
    assert selector._select_batch._get_max_batch_size() == 1
    # An endpoint's calls of a batch run concurrently (see select_all): batched as configured.
    endpoint = {"backend": "openai", "url": "http://127.0.0.1:9/v1", "model": "m"}
    asyncio.run(selector.reconfigure({**endpoint, **batching}))
    assert selector._select_batch._get_max_batch_size() == 4
