"""Constraints that compile but fail at their first token are 400s at submission naming the field;
large valid ones work."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

pytestmark = [pytest.mark.model, pytest.mark.integration]  # the embedded model, through the installed plugins

SELF_REFERENCE = {"$ref": "#"}
NO_BASE_CASE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
EVERY_LEVEL_REQUIRED = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
THOUSAND_STRINGS = {
    "type": "object",
    "properties": {f"field_{i}": {"type": "string", "maxLength": 4} for i in range(1000)},
}
CHAT = "/v1/chat/completions"

REFUSED = [
    ("/v1/completions", {"guided_json": SELF_REFERENCE}, "guided_json", "no text satisfies the json_schema"),
    ("/v1/completions", {"guided_json": NO_BASE_CASE}, "guided_json", "no text satisfies the json_schema"),
    ("/v1/completions", {"guided_json": EVERY_LEVEL_REQUIRED}, "guided_json", "limit structured_output.step_max_items"),
    ("/v1/completions", {"guided_regex": "[^\\x00-\\x{10FFFF}]"}, "guided_regex", "no text satisfies the regex"),
    ("/v1/completions", {"guided_regex": "((a{1000}){1000}){1000}"}, "guided_regex", "the regex cannot be used"),
    ("/v1/completions", {"structured_outputs": {"json": SELF_REFERENCE}}, "structured_outputs", "no text satisfies"),
    (
        CHAT,
        {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": EVERY_LEVEL_REQUIRED}}},
        "response_format",
        "step_max_items",
    ),
    (CHAT, {"guided_regex": "[^\\x00-\\x{10FFFF}]", "stream": True}, "guided_regex", "no text satisfies the regex"),
    (
        CHAT,
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": SELF_REFERENCE}}],
            "tool_choice": "required",
        },
        "tools",
        "a function's parameters schema cannot be used: no text satisfies",
    ),
]


@pytest.mark.parametrize(
    ("path", "fields", "param", "message"),
    REFUSED,
    ids=[f"{'chat' if path == CHAT else 'completions'}-{param}-{i}" for i, (path, _, param, _) in enumerate(REFUSED)],
)
def test_a_constraint_no_first_token_can_start_is_a_400_naming_its_field(
    model_server, path, fields, param, message
) -> None:
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    response = httpx.post(f"{model_server.url}{path}", json={**body, "max_tokens": 8, **fields}, timeout=120)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert message in error["message"], error["message"]


def test_a_thousand_optional_string_properties_work_like_any_schema(model_server) -> None:
    client = openai.OpenAI(base_url=f"{model_server.url}/v1", api_key="unused", max_retries=0)
    response = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Fill in a few of the fields as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "fields", "schema": THOUSAND_STRINGS}},
        max_tokens=60,
        temperature=1.0,
        seed=5,
        n=3,
    )
    for choice in response.choices:
        text = choice.message.content
        assert text.startswith("{"), text
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(text), THOUSAND_STRINGS)
        else:
            assert choice.finish_reason == "length"
