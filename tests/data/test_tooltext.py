"""Parsing ToolBench-style tool documents into fields."""

from __future__ import annotations

import json

from components.data.tooltext import parse_tool_text

TOOLBENCH = (
    "category_name:Food, tool_name:Worldwide Recipes, api_name:Suggestions, "
    "api_description:Get suggestions: recipes, ingredients, and more, for example: pasta, "
    'required_params: [{"name": "q", "type": "STRING", "description": "search text, e.g. chicken: grilled", '
    '"default": "chicken"}], '
    'optional_params: [{"name": "limit", "type": "NUMBER", "description": "max results", "default": 10}], '
    'return_schema: {"results": [{"title": "str", "url": "str"}], "count": "int"}'
)


def test_toolbench_fields_are_split_on_known_keys() -> None:
    rec = parse_tool_text("42", TOOLBENCH)
    assert rec.id == "42"
    assert rec.raw == TOOLBENCH
    assert rec.category == "Food"
    assert rec.tool == "Worldwide Recipes"
    assert rec.api == "Suggestions"
    assert rec.name == "Worldwide Recipes / Suggestions"


def test_toolbench_description_keeps_commas_and_colons() -> None:
    rec = parse_tool_text("42", TOOLBENCH)
    assert rec.description == "Get suggestions: recipes, ingredients, and more, for example: pasta"


def test_toolbench_params_and_schema_are_parsed() -> None:
    rec = parse_tool_text("42", TOOLBENCH)
    assert rec.required_params == [
        {
            "name": "q",
            "type": "STRING",
            "description": "search text, e.g. chicken: grilled",
            "default": "chicken",
        }
    ]
    assert rec.optional_params == [
        {"name": "limit", "type": "NUMBER", "description": "max results", "default": 10}
    ]
    assert json.loads(rec.return_schema) == {"results": [{"title": "str", "url": "str"}], "count": "int"}


def test_empty_param_lists() -> None:
    rec = parse_tool_text("7", "tool_name:Clock, api_name:now, required_params: [], optional_params: []")
    assert rec.required_params == []
    assert rec.optional_params == []
    assert rec.description == ""
    assert rec.category == ""


def test_malformed_params_kept_as_free_text() -> None:
    text = (
        "tool_name:Mail, api_name:send, api_description:Send a mail, "
        "required_params: [{name: to, type: STRING}, optional_params: [{'name': 'cc'}]"
    )
    rec = parse_tool_text("m", text)
    assert rec.description == "Send a mail"
    assert rec.required_params == [{"name": "", "type": "", "description": "[{name: to, type: STRING}"}]
    assert rec.optional_params == [{"name": "", "type": "", "description": "[{'name': 'cc'}]"}]


def test_non_list_params_are_wrapped() -> None:
    text = 'tool_name:X, required_params: {"name": "a"}, optional_params: ["b", 3]'
    rec = parse_tool_text("x", text)
    assert rec.required_params == [{"name": "a"}]
    assert rec.optional_params == [{"name": "b"}, {"name": "3"}]


def test_free_form_text_becomes_description() -> None:
    text = "  Converts currencies: USD, EUR, and GBP; rates refresh hourly.  "
    rec = parse_tool_text("fx", text)
    assert rec.description == "Converts currencies: USD, EUR, and GBP; rates refresh hourly."
    assert rec.raw == text
    assert (rec.category, rec.tool, rec.api, rec.return_schema) == ("", "", "", "")
    assert rec.required_params == []
    assert rec.optional_params == []
    assert rec.name == "fx"


def test_repeated_key_keeps_first_value() -> None:
    rec = parse_tool_text("r", "tool_name:First, api_name:a, tool_name:Second")
    assert rec.tool == "First"


def test_to_row_serialises_params_as_json() -> None:
    row = parse_tool_text("42", TOOLBENCH).to_row()
    assert row["id"] == "42"
    assert row["description"].startswith("Get suggestions")
    assert json.loads(row["required_params"])[0]["name"] == "q"
    assert json.loads(row["optional_params"])[0]["name"] == "limit"
    assert all(isinstance(v, str) for v in row.values())


def test_tool_document_takes_one_field_name_or_a_list() -> None:
    from components.data.tooltext import tool_document

    text = "category_name:Food, tool_name:Recipes, api_name:Find, api_description:Find recipes"
    record = {"_id": "7", "text": text}
    assert tool_document(record, "description") == tool_document(record, ["description"]) == "Find recipes"
    try:
        tool_document(record, ["nope"])
    except ValueError as e:
        assert "unknown tool field 'nope'" in str(e)
    else:
        raise AssertionError("an unknown field must raise")
