"""Catalog parsing, JSON schemas, weak argument labels and the call token layout."""

from __future__ import annotations

from components.generative.lm import train_bpe
from components.serving.callformat import CallFormat, format_value
from components.serving.catalog import Param, Tool, ToolCatalog, json_type
from components.serving.selector_task import call_rows
from components.serving.weak_args import weak_arguments

RECORD = {
    "_id": "7",
    "title": "",
    "text": "category_name:Travel, tool_name:Fly, api_name:search flights, api_description:Find flights, "
    'required_params: [{"name": "origin", "type": "STRING", "description": "from"}, '
    '{"name": "seats", "type": "NUMBER", "description": ""}], '
    'optional_params: [{"name": "cabin", "type": "str"}], return_schema: {}',
    "metadata": {},
}


def test_catalog_entry_and_schema():
    catalog = ToolCatalog.from_records([RECORD, {"_id": "8", "title": "Free text", "text": "just words"}])
    tool = catalog.tools["7"]
    assert tool.name == "Fly / search flights" and catalog.name("8") == "Free text"
    assert [(p.name, p.type) for p in tool.required] == [("origin", "string"), ("seats", "number")]
    schema = tool.json_schema()
    assert schema["required"] == ["origin", "seats"] and set(schema["properties"]) == {
        "origin",
        "seats",
        "cabin",
    }
    assert catalog.name("unknown") == "unknown" and len(catalog.version) == 12
    assert json_type("INT") == "integer" and json_type("weird") == "string"


def test_catalog_version_changes_with_content():
    a = ToolCatalog.from_records([RECORD])
    b = ToolCatalog.from_records([{**RECORD, "text": RECORD["text"].replace("Fly", "Soar")}])
    assert a.version != b.version


def test_weak_arguments_copy_entities_and_numbers():
    tool = Tool(
        "1",
        "FX / convert",
        "Convert money",
        (
            Param("amount", "number"),
            Param("from_currency", "string"),
            Param("to_currency", "string"),
        ),
    )
    labels = weak_arguments("please convert 250 JPY to CHF", tool)
    assert labels == {"amount": 250, "from_currency": "JPY", "to_currency": "CHF"}
    # As the query writes it: "250", not "250.0", which the number grammar could not spell.
    assert format_value(labels["amount"]) == "250"
    assert weak_arguments("convert -2.5 EUR to USD", tool)["amount"] == -2.5
    counter = Tool("3", "Dice / roll", "Roll dice", (Param("sides", "integer"), Param("weight", "number")))
    # An integer parameter skips a fraction; numbers inside dates or versions are no arguments.
    assert weak_arguments("roll 2.5 then 6 on 2024-01-02 with v2", counter) == {"sides": 6, "weight": 2.5}
    weather = Tool("2", "Sky / weather forecast", "Weather forecast for a city", (Param("city", "string"),))
    assert weak_arguments("what is the weather forecast in Paris tomorrow", weather) == {"city": "Paris"}
    assert weak_arguments("forecast please", weather) == {}


def test_an_mcp_tool_s_required_keys_are_labelled_and_written():
    # An MCP tool keeps its parameters in its own input schema, not in ``required``: the selector's
    # labels and call layout read them from there (they used to see no parameters at all).
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "city name"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    tool = Tool("weather/forecast", "forecast", "Daily weather forecast for a city", input_schema=schema)
    assert tool.required == ()
    labels = weak_arguments("weather forecast in Oslo for 3 days", tool)
    assert labels == {"city": "Oslo", "days": 3}
    tok = train_bpe(["request: weather tool: forecast city = Oslo days = 3"] * 20, vocab_size=300)
    fmt = CallFormat(tok)
    assert fmt.target(tool, labels) == fmt.name(tool) + fmt.key(tool.call_params()[0]) + fmt.value("Oslo") + (
        fmt.key(tool.call_params()[1]) + fmt.value(3)
    )


def test_call_layout_ends_name_and_values_with_eos():
    tok = train_bpe(["request: hello world tool: Fly search flights origin = Paris"] * 20, vocab_size=300)
    fmt = CallFormat(tok)
    tool = Tool("7", "Fly / search flights", "", (Param("origin", "string"),))
    target = fmt.target(tool, {"origin": "Paris"})
    assert target[: len(fmt.name(tool))] == fmt.name(tool) and fmt.name(tool)[-1] == tok.eos_token_id
    assert target[-1] == tok.eos_token_id and target.count(tok.eos_token_id) == 2
    assert fmt.prompt("hi")[0] == tok.bos_token_id
    # A request over the budget loses the start of its text, not BOS nor the cue the call follows.
    long = "please tell me in great detail and at length " * 4 + "flights from Paris"
    cut = fmt.prompt(long, 12)
    assert len(cut) == 12 and cut[0] == tok.bos_token_id and len(fmt.prompt(long)) > 12
    assert tok.decode(cut[1:]).replace(" ", "").endswith("Paris\ntool:")
    assert fmt.prompt("hi", 12) == fmt.prompt("hi")  # a short one is left alone
    ((prompt, call),) = call_rows([(long, tool, {"origin": "Paris"})], fmt, budget=20)
    assert len(prompt) + len(call) == 20 and call == target and prompt == fmt.prompt(long, 20 - len(target))
    assert fmt.target(tool, {}) == fmt.name(tool)  # unlabelled parameters are not written
    # Floats are written positionally: an exponent ("1e-05") is outside the number grammar.
    assert [format_value(v) for v in (2.5, 250.0, 1e-05, -0.25, True)] == [
        "2.5",
        "250",
        "0.00001",
        "-0.25",
        "true",
    ]
