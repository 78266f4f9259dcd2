"""The OpenAI-compatible selector against a real local HTTP server that decodes with the trained LM."""

from __future__ import annotations

import json

import pytest
from local_openai_server import LocalChatServer
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)

from components.serving.catalog import ToolCatalog
from components.serving.selector_http import OpenAISelector, SelectorHTTPError
from components.serving.selector_lm import LMSelector


@pytest.fixture(scope="module")
def server(selector_lm, catalog):
    with LocalChatServer(LMSelector(selector_lm[0], catalog)) as s:
        yield s


def test_request_shape_and_parsed_call(server, catalog, dataset, monkeypatch):
    monkeypatch.setenv("LLM_KEY", "s3cret")
    client = OpenAISelector(server.url, "local-selector", catalog, api_key_env="LLM_KEY")
    query = next(iter(dataset.split_queries("test").values()))
    candidates = list(catalog.tools)[:4]
    call = client.select(query, ["earlier turn"], candidates)
    sent = server.requests[-1]
    body = sent["body"]
    assert sent["headers"]["Authorization"] == "Bearer s3cret"
    assert body["model"] == "local-selector" and body["tool_choice"] == "required"
    assert body["max_tokens"] == 160  # a call is short: a looping small model stops at the cap
    assert [m["role"] for m in body["messages"]] == ["system", "user", "user"]
    assert body["messages"][-1]["content"] == query
    names = [t["function"]["name"] for t in body["tools"]]
    assert names == ["tool_0", "tool_1", "tool_2", "tool_3"]
    assert body["tools"][0]["function"]["parameters"] == catalog.tools[candidates[0]].json_schema()
    assert call is not None and call["tool"] in candidates
    assert set(call["arguments"]) >= {p.name for p in catalog.tools[call["tool"]].required}
    json.dumps(call["arguments"])


def test_a_tool_that_was_not_offered_is_rejected(server, catalog):
    client = OpenAISelector(server.url, "m", catalog)
    server.offer_unknown_tool = True
    try:
        assert client.select("weather in Paris", [], list(catalog.tools)[:3]) is None
    finally:
        server.offer_unknown_tool = False


def test_no_candidates_is_no_call_and_no_request(server, catalog):
    # OpenAI-compatible servers refuse an empty tools list (vLLM answers 400): nothing is sent.
    client = OpenAISelector(server.url, "m", catalog)
    sent = len(server.requests)
    assert client.select("weather in Paris", [], []) is None
    assert client.select("weather in Paris", [], ["not-a-catalog-tool"]) is None
    assert len(server.requests) == sent


def test_unreachable_endpoint_is_a_selector_error(catalog):
    from serving_helpers import free_port

    client = OpenAISelector(f"http://127.0.0.1:{free_port()}/v1", "m", catalog, timeout_s=2)
    with pytest.raises(SelectorHTTPError):
        client.select("weather in Paris", [], list(catalog.tools)[:3])


def test_parse_rejects_malformed_answers(catalog):
    client = OpenAISelector("http://127.0.0.1:1/v1", "m", catalog)
    cands = list(catalog.tools)[:2]
    fn = {"name": "tool_0", "arguments": "not json"}
    answer = {"choices": [{"message": {"tool_calls": [{"function": fn}]}}]}
    assert client.parse(answer, cands) is None
    assert client.parse({"choices": [{"message": {"content": "hi"}}]}, cands) is None
    with pytest.raises(SelectorHTTPError):
        client.parse({"error": "nope"}, cands)
    # These were AttributeErrors from deep in the parse, not the selector's own error or no call.
    assert client.parse({"choices": [{"message": None}]}, cands) is None  # no message: no call
    with pytest.raises(SelectorHTTPError, match="tool_calls is not a list of calls"):
        client.parse({"choices": [{"message": {"tool_calls": ["tool_0"]}}]}, cands)
    assert client.parse({"choices": [{"message": {"tool_calls": [{"function": "tool_0"}]}}]}, cands) is None


def chat_answer(name: str, arguments) -> dict:
    return {"choices": [{"message": {"tool_calls": [{"function": {"name": name, "arguments": arguments}}]}}]}


def test_a_call_that_breaks_the_tool_s_own_schema_is_refused():
    # An MCP tool's schema says more than required keys: types, enums, no extra keys. A server's
    # guided decoding may not have held the model to it; the selector checks.
    schema = {
        "type": "object",
        "properties": {"mode": {"type": "string", "enum": ["on", "off"]}, "n": {"type": "integer"}},
        "required": ["mode", "n"],
        "additionalProperties": False,
    }
    record = {"_id": "lamp/set", "title": "set", "text": "set a lamp", "metadata": {"input_schema": schema}}
    catalog = ToolCatalog.from_records([record])
    client = OpenAISelector("http://127.0.0.1:9/v1", "m", catalog)
    good = {"mode": "on", "n": 2}
    assert client.parse(chat_answer("tool_0", json.dumps(good)), ["lamp/set"]) == {
        "tool": "lamp/set",
        "arguments": good,
    }
    assert (
        client.parse(chat_answer("tool_0", good), ["lamp/set"])["arguments"] == good
    )  # an object, not a string
    for bad in (
        {"mode": "explode", "n": 2},
        {"mode": "on", "n": "lots"},
        {"mode": "on", "n": 2, "x": 1},
        {"n": 2},
    ):
        assert client.parse(chat_answer("tool_0", json.dumps(bad)), ["lamp/set"]) is None, bad
    assert (
        client.parse(chat_answer("tool_\u00b2", json.dumps(good)), ["lamp/set"]) is None
    )  # not an ASCII index
    assert "mode" in catalog.tools["lamp/set"].argument_errors({"mode": "explode", "n": 2})
