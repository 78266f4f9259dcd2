"""The real Serve app on 127.0.0.1, over HTTP and MCP: answers, versions, OpenAPI, bad inputs, the API key."""

from __future__ import annotations

import json

import pytest
import requests
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import deploy, mcp_session

from components.serving.models import DetectorModel, RetrieverModel
from components.serving.schemas import MAX_QUERY_CHARS, MAX_TOP_K


@pytest.fixture(scope="module")
def app_args(bm25_versions, serving_data, selector_lm):
    return {
        "artifact": bm25_versions["default"],
        "catalog": serving_data,
        "detector_file": bm25_versions["detector_file"],
        "selector": {"backend": "lm", "model": selector_lm[0]},
        "rewriter": {"backend": "history", "turns": 1},
    }


@pytest.fixture(scope="module")
def url(serve_instance, app_args):
    deploy(app_args)
    return serve_instance


def post(url: str, body, **kwargs) -> requests.Response:
    return requests.post(f"{url}/v1/select", json=body, timeout=30, **kwargs)


def test_health_tools_and_docs(url, dataset, catalog):
    assert requests.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
    info = requests.get(f"{url}/v1/tools", timeout=10).json()
    assert info == {
        "size": len(dataset.corpus),
        "model_version": "bm25/v0001",
        "catalog_version": catalog.version,
    }
    assert requests.get(f"{url}/docs", timeout=10).status_code == 200
    spec = requests.get(f"{url}/openapi.json", timeout=10).json()
    assert {"/v1/select", "/v1/tools", "/healthz"} <= set(spec["paths"])
    assert {"query", "top_k", "history", "needs_tool_threshold"} <= set(
        spec["components"]["schemas"]["SelectRequest"]["properties"]
    )


def test_tool_query_gets_ranking_call_and_version(url, dataset, catalog):
    query = next(iter(dataset.split_queries("test").values()))
    r = post(url, {"query": query, "top_k": 4, "needs_tool_threshold": 0.0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["needs_tool"] is True and 0.0 <= body["probability"] <= 1.0
    assert len(body["tools"]) == 4 and all(t["id"] in dataset.corpus for t in body["tools"])
    assert [t["name"] for t in body["tools"]] == [catalog.name(t["id"]) for t in body["tools"]]
    scores = [t["score"] for t in body["tools"]]
    assert scores == sorted(scores, reverse=True)
    assert body["call"]["tool"] in [t["id"] for t in body["tools"]]
    assert set(body["call"]["arguments"]) == {p.name for p in catalog.tools[body["call"]["tool"]].required}
    assert body["model_version"] == "bm25/v0001"
    assert body["versions"] == {"detector": "bm25/v0001", "retriever": "bm25/v0001"}
    assert {"detect", "rewrite", "retrieve", "select", "total"} <= set(body["timings_ms"])


def test_probability_is_the_in_process_detectors(url, dataset, bm25_versions):
    detector = DetectorModel(bm25_versions["default"], bm25_versions["detector_file"])
    queries = [*list(dataset.split_queries("test").values())[:3], *dataset.neg_split["test"][:3]]
    for query, expected in zip(queries, detector.probabilities(queries), strict=True):
        assert post(url, {"query": query}).json()["probability"] == pytest.approx(expected, abs=1e-9)


def test_no_tool_needed_skips_retrieval(url, dataset, bm25_versions):
    detector = DetectorModel(bm25_versions["default"], bm25_versions["detector_file"])
    negatives = dataset.neg_split["test"]
    query = next(q for q, p in zip(negatives, detector.probabilities(negatives), strict=True) if p < 0.5)
    body = post(url, {"query": query}).json()
    assert body["needs_tool"] is False and body["tools"] == [] and body["call"] is None
    assert "retrieve" not in body["timings_ms"] and body["model_version"] == "bm25/v0001"
    # The detector answered alone: its version is reported, the retriever's is null.
    assert body["versions"] == {"detector": "bm25/v0001", "retriever": None}


def test_history_reaches_retrieval_through_the_rewriter(url, bm25_versions):
    # The app's rewriter is `history` with one turn: the retriever searches "<last turn> <query>".
    query, history = "and the forecast there?", ["I am flying to Paris"]
    r = post(url, {"query": query, "history": history, "top_k": 2, "needs_tool_threshold": 0.0})
    assert r.status_code == 200, r.text
    retriever = RetrieverModel(bm25_versions["default"])
    with_history = [t for t, _ in retriever.retrieve([f"{history[-1]} {query}"], 2)[0]]
    alone = [t for t, _ in retriever.retrieve([query], 2)[0]]
    assert with_history != alone  # the history changes what is retrieved...
    assert [t["id"] for t in r.json()["tools"]] == with_history  # ...and the app searched with it


BAD_JSON = [
    ("wrong type: query", {"query": 5}),
    ("wrong type: top_k string", {"query": "weather", "top_k": "5"}),
    ("wrong type: top_k float", {"query": "weather", "top_k": 2.5}),
    ("wrong type: history", {"query": "weather", "history": "earlier"}),
    ("wrong type: threshold", {"query": "weather", "needs_tool_threshold": "high"}),
    ("unknown field", {"query": "weather", "k": 3}),
    ("missing query", {"top_k": 3}),
    ("empty query", {"query": ""}),
    ("whitespace query", {"query": " \n\t "}),
    ("over-long query", {"query": "a" * (MAX_QUERY_CHARS + 1)}),
    ("top_k zero", {"query": "weather", "top_k": 0}),
    ("top_k too large", {"query": "weather", "top_k": MAX_TOP_K + 1}),
    ("threshold out of range", {"query": "weather", "needs_tool_threshold": 1.5}),
    ("body not an object", ["weather"]),
    # Valid JSON ("\ud800" escapes), but not Unicode text: fast tokenizers raise on it.
    ("lone surrogate in query", {"query": "weather \ud800"}),
    ("lone surrogate in history", {"query": "weather", "history": ["\udc00"]}),
]


@pytest.mark.parametrize(("case", "body"), BAD_JSON, ids=[c for c, _ in BAD_JSON])
def test_bad_json_input_is_a_422_json_error(url, case, body):
    r = post(url, body)
    assert r.status_code == 422, (case, r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and error["details"], case


def test_non_json_body_is_a_400(url):
    # A syntax error, bytes that are not UTF-8, and nesting too deep for the parser: the last two
    # FastAPI refuses with a bare 400, which was named "http_error".
    for data in (b"query=weather", b'{"query": "caf\xe9"}', b"[" * 100_000):
        r = requests.post(f"{url}/v1/select", data=data, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", (data[:20], r.text)


def test_a_body_over_a_mebibyte_is_a_413_through_serve(url):
    r = requests.post(
        f"{url}/v1/select", data=b" " * (2 << 20), headers={"Content-Type": "application/json"}, timeout=30
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_wrong_content_type_is_a_415(url):
    data = json.dumps({"query": "weather"})
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        r = requests.post(f"{url}/v1/select", data=data, headers={"Content-Type": content_type}, timeout=10)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
        assert "application/json" in r.json()["error"]["message"]


def test_missing_content_type_is_a_415(url):
    # requests sends bytes without a Content-Type; FastAPI alone would parse them as JSON and answer.
    for data in (json.dumps({"query": "weather in Paris"}).encode(), b"query=weather", b""):
        r = requests.post(f"{url}/v1/select", data=data, timeout=10)
        assert "content-type" not in {k.lower() for k in r.request.headers}
        assert r.status_code == 415, (data, r.text)
        error = r.json()["error"]
        assert error["code"] == "unsupported_media_type" and "no Content-Type" in error["message"]


def test_unknown_route_and_method_are_json(url):
    r = requests.get(f"{url}/v1/nope", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = requests.get(f"{url}/v1/select", timeout=10)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_mcp_find_tools_answers_as_the_http_api_with_catalog_tools_only(url, dataset, catalog):
    queries = list(dataset.split_queries("test").values())[:3]

    async def work(client):
        listed = {t.name: t for t in (await client.list_tools()).tools}
        found = [await client.call_tool("find_tools", {"query": q, "k": 4}) for q in queries]
        name = catalog.name(next(iter(dataset.corpus)))
        one = await client.call_tool("get_tool", {"name": name})
        missing = await client.call_tool("get_tool", {"name": "no such tool"})
        return listed, found, one, missing

    listed, found, one, missing = mcp_session(f"{url}/mcp/", work)
    assert set(listed) == {"find_tools", "get_tool"}
    assert listed["find_tools"].input_schema["required"] == ["query"]
    for query, result in zip(queries, found, strict=True):
        assert not result.is_error
        answer = result.structured_content
        http = post(url, {"query": query, "top_k": 4}).json()
        # One code path: the same request gets the same answer through both doors.
        assert answer["needs_tool"] == http["needs_tool"] and answer["model_version"] == http["model_version"]
        pairs = [(t["id"], t["score"]) for t in http["tools"]]
        assert [(t["id"], t["score"]) for t in answer["tools"]] == pairs
        for tool in answer["tools"]:
            assert tool["id"] in dataset.corpus
            assert tool["input_schema"] == catalog.tools[tool["id"]].json_schema()
            assert tool["description"] == catalog.tools[tool["id"]].description
        assert json.loads(result.content[0].text) == answer
    assert one.structured_content["name"] == catalog.name(next(iter(dataset.corpus)))
    assert missing.is_error and "no such tool" in missing.content[0].text


@pytest.mark.parametrize(
    "args, says",
    [
        ({"query": "weather", "k": 0}, "k:"),
        ({"query": "weather", "k": "3"}, "k:"),
        ({"k": 3}, "query:"),
        ({"query": "weather", "top": 3}, "unknown arguments ['top']"),
        ({"query": "x" * (MAX_QUERY_CHARS + 1)}, "query:"),
    ],
)
def test_mcp_bad_argument_is_a_tool_error_the_model_sees(url, args, says):
    # MCP 2025-11-25 (SEP-1303): a tool result with isError, not a JSON-RPC error.
    async def work(client):
        return await client.call_tool("find_tools", args)

    answer = mcp_session(f"{url}/mcp/", work)
    assert answer.is_error and says in answer.content[0].text, answer.content[0].text
