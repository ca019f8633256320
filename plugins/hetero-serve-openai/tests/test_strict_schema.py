"""OpenAI's ``strict: true``: every object of the schema holds only the keys it lists; without it,
JSON Schema as written."""

from __future__ import annotations

import copy

import pytest

from hetero_serve_openai.constraints import ResponseFormat
from hetero_serve_openai.strict import strict_schema
from hetero_serve_openai.tools import FunctionDefinition, ToolFields, arguments_schema, tool_calls_constraint

OPEN_POINT = {"type": "object", "properties": {"x": {"type": "integer"}}}
CLOSED_POINT = {"type": "object", "properties": {"x": {"type": "integer"}}, "additionalProperties": False}

CASES = [
    ("an object", OPEN_POINT, CLOSED_POINT),
    (
        "objects nested in properties, items, anyOf and $defs",
        {
            "type": "object",
            "properties": {
                "p": OPEN_POINT,
                "list": {"type": "array", "items": OPEN_POINT},
                "either": {"anyOf": [OPEN_POINT, {"type": "null"}]},
            },
            "$defs": {"point": OPEN_POINT},
        },
        {
            "type": "object",
            "properties": {
                "p": CLOSED_POINT,
                "list": {"type": "array", "items": CLOSED_POINT},
                "either": {"anyOf": [CLOSED_POINT, {"type": "null"}]},
            },
            "$defs": {"point": CLOSED_POINT},
            "additionalProperties": False,
        },
    ),
    (
        "an object that says additionalProperties",
        {**OPEN_POINT, "additionalProperties": True},
        {**OPEN_POINT, "additionalProperties": True},
    ),
    (
        "an object whose additional values have a schema",
        {"type": "object", "properties": {}, "additionalProperties": OPEN_POINT},
        {"type": "object", "properties": {}, "additionalProperties": CLOSED_POINT},
    ),
    ("a free-form map", {"type": "object"}, {"type": "object"}),
    (
        "pattern properties",
        {"patternProperties": {"^x": {}}},
        {"patternProperties": {"^x": {}}, "additionalProperties": False},
    ),
    (
        "allOf members: open, and the whole closed over their keys",
        {"allOf": [OPEN_POINT, {"properties": {"y": {"type": "integer"}}}]},
        {
            "allOf": [OPEN_POINT, {"properties": {"y": {"type": "integer"}}}],
            "properties": {"x": {}, "y": {}},
            "additionalProperties": False,
        },
    ),
    ("a boolean schema", True, True),
]


@pytest.mark.parametrize(("schema", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_strict_closes_every_object_that_lists_its_keys(schema, expected) -> None:
    before = copy.deepcopy(schema)
    assert strict_schema(schema) == expected
    assert schema == before


@pytest.mark.parametrize(("strict", "expected"), [(True, CLOSED_POINT), (False, OPEN_POINT), (None, OPEN_POINT)])
def test_response_format_closes_objects_only_under_strict(strict, expected) -> None:
    json_schema = {"name": "point", "schema": OPEN_POINT} | ({} if strict is None else {"strict": strict})
    constraint = ResponseFormat.model_validate({"type": "json_schema", "json_schema": json_schema}).constraint()
    assert constraint.schema == expected


@pytest.mark.parametrize(("strict", "num_closed"), [(True, 2), (False, 1), (None, 1)])
def test_a_call_holds_its_declared_parameters_and_strict_closes_nested_objects_too(strict, num_closed) -> None:
    function = FunctionDefinition.model_validate(
        {"name": "f", "parameters": {"type": "object", "properties": {"p": OPEN_POINT}}, "strict": strict}
    )
    for free_text in (False, True):
        (called,) = tool_calls_constraint([function], several=False, free_text=free_text).value.functions
        assert called.schema == arguments_schema(function)
        assert called.parameters.count('"additionalProperties":false') == num_closed, called.parameters


def test_a_function_without_parameters_takes_no_arguments() -> None:
    (called,) = tool_calls_constraint([FunctionDefinition(name="f")], several=False).value.functions
    assert called.schema == {"type": "object", "properties": {}, "additionalProperties": False}


@pytest.mark.parametrize(("strict", "constrained"), [(True, True), (False, False), (None, False)])
def test_auto_is_constrained_once_a_function_is_strict(strict, constrained) -> None:
    function = {"name": "f", "parameters": OPEN_POINT} | ({} if strict is None else {"strict": strict})
    tools = ToolFields.model_validate(
        {"tools": [{"type": "function", "function": function}, {"type": "function", "function": {"name": "g"}}]}
    )
    plan = tools.tool_plan(has_structured_output=False)
    assert plan.parses_calls and not plan.is_forced and (plan.constraint is not None) is constrained
    if constrained:
        assert plan.constraint == tool_calls_constraint(
            [tool.function for tool in tools.tools], several=True, free_text=True
        )
