"""The OpenAI surface: structured output and logit_bias with the official client on the real model,
refusals, model cards."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pydantic
import pytest

from hetero_core.tool_prompt import inline_tools
from hetero_serve_openai.schemas import ChatCompletionRequest, CompletionRequest

pytestmark = [pytest.mark.model, pytest.mark.integration]  # the embedded model, through the installed plugins

CITY = [{"role": "user", "content": "Describe Paris as JSON: its name, its country and whether it is a capital."}]


class City(pydantic.BaseModel):
    name: str
    country: str
    is_capital: bool


@pytest.fixture(scope="module")
def client(model_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{model_server.url}/v1", api_key="unused", max_retries=0)


def test_parse_with_a_pydantic_model(client) -> None:
    completion = client.beta.chat.completions.parse(
        model="smollm2", messages=CITY, response_format=City, max_tokens=80, temperature=0
    )
    city = completion.choices[0].message.parsed
    assert isinstance(city, City) and completion.choices[0].finish_reason == "stop"


def test_json_keys_come_in_the_order_of_the_schema(client) -> None:
    answer = {
        "type": "object",
        "properties": {"value": {"type": "integer", "maximum": 1000}, "unit": {"enum": ["km", "miles"]}},
        "required": ["value", "unit"],
        "additionalProperties": False,
    }
    schema = {
        "type": "object",
        "properties": {"reasoning": {"type": "string", "maxLength": 60}, "answer": answer},
        "required": ["reasoning", "answer"],
        "additionalProperties": False,
    }
    question = [{"role": "user", "content": "How far is Paris from Lyon? Think, then answer."}]
    completion = client.chat.completions.create(
        model="smollm2",
        messages=question,
        max_tokens=120,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "distance", "schema": schema}},
    )
    value = json.loads(completion.choices[0].message.content)
    assert list(value) == ["reasoning", "answer"] and list(value["answer"]) == ["value", "unit"]


@pytest.mark.parametrize("strict", [True, False])
def test_strict_keeps_out_keys_the_schema_does_not_list(client, model_server, strict) -> None:
    schema = {
        "type": "object",
        "properties": {"digit": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["digit"],
    }
    tokenizer = model_server.engine.tokenizer
    more_keys = {
        str(tokenizer.encode(text, add_special_tokens=False)[0]): 100 for text in (",", ", ")
    }  # another key, if allowed
    completion = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Pick a digit, as JSON."}],
        max_tokens=24,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "digit", "schema": schema, "strict": strict}},
        logit_bias=more_keys,
    )
    text = completion.choices[0].message.content
    if strict:  # OpenAI's strict mode: no keys but the listed ones
        assert list(json.loads(text)) == ["digit"] and completion.choices[0].finish_reason == "stop", text
    else:  # JSON Schema as written: other keys are allowed
        assert re.match(r'\{"digit": \d, "', text), text


def test_json_object_streams_one_object(client) -> None:
    stream = client.chat.completions.create(
        model="smollm2",
        messages=CITY,
        response_format={"type": "json_object"},
        max_tokens=120,
        temperature=0,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert isinstance(json.loads(text), dict)


def test_vllm_structured_outputs_on_both_endpoints(client) -> None:
    phone = client.completions.create(
        model="smollm2",
        prompt="My phone number is",
        max_tokens=16,
        temperature=1.0,
        n=3,
        seed=4,
        extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}},
    )
    assert all(re.fullmatch(r"\d{3}-\d{4}", choice.text) for choice in phone.choices)
    answer = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Is the sky blue?"}],
        max_tokens=8,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert answer.choices[0].message.content in ("yes", "no")


def test_logit_bias_of_minus_100_removes_the_greedy_token(client, model_server) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    plain = client.chat.completions.create(model="smollm2", messages=question, max_tokens=12, temperature=0)
    assert "Paris" in plain.choices[0].message.content
    tokenizer = model_server.engine.tokenizer
    paris = {str(tokenizer.encode(word, add_special_tokens=False)[0]): -100 for word in (" Paris", "Paris")}
    biased = client.chat.completions.create(
        model="smollm2", messages=question, max_tokens=12, temperature=0, logit_bias=paris
    )
    assert "Paris" not in biased.choices[0].message.content


REFUSED = [
    ("/v1/completions", {"suffix": "!"}, "suffix"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"max_tokens": 0, "echo": True}, "max_tokens"),
    ("/v1/completions", {"skip_special_tokens": "no"}, "skip_special_tokens"),
    ("/v1/chat/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/chat/completions", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ("/v1/completions", {"structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs"),
    ("/v1/completions", {"structured_outputs": {"regex": "a("}}, "structured_outputs"),
    ("/v1/completions", {"guided_json": {"type": "no-such-type"}}, "guided_json"),
    ("/v1/completions", {"logit_bias": {"the": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"99999": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"\uff11\uff12": 1}}, "logit_bias"),  # full-width digits: not token id 12
    ("/v1/completions", {"logit_bias": {"\u00b2": 1}}, "logit_bias"),
    ("/v1/completions", {"top_k": -2}, "top_k"),
]


@pytest.mark.parametrize(
    ("path", "fields", "param"), REFUSED, ids=[f"{p.rsplit('/', 1)[1]}-{param}" for p, _, param in REFUSED]
)
def test_unsupported_or_invalid_fields_are_400s_naming_them(mock_server, path, fields, param) -> None:
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    response = httpx.post(f"{mock_server.url}{path}", json={**body, "max_tokens": 2, **fields}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


def test_models_carry_the_context_length_and_can_be_fetched_by_id(mock_server) -> None:
    listed = httpx.get(f"{mock_server.url}/v1/models", timeout=30).json()["data"]
    (card,) = listed
    assert card["max_model_len"] == mock_server.engine.max_model_len
    assert httpx.get(f"{mock_server.url}/v1/models/{card['id']}", timeout=30).json() == card
    missing = httpx.get(f"{mock_server.url}/v1/models/other", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_a_stream_keeps_one_created_time(mock_server) -> None:
    body = {"prompt": "x", "max_tokens": 30, "stream": True}
    with httpx.stream("POST", f"{mock_server.url}/v1/completions", json=body, timeout=30) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert len(events) > 2 and len({event["created"] for event in events}) == 1


def test_a_wrong_method_is_a_typed_405(mock_server) -> None:
    response = httpx.get(f"{mock_server.url}/v1/completions", timeout=30)
    assert response.status_code == 405 and response.json()["error"]["type"] == "invalid_request_error"


def test_an_image_part_is_a_clear_400(mock_server) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}],
        "max_tokens": 2,
    }
    response = httpx.post(f"{mock_server.url}/v1/chat/completions", json=body, timeout=30)
    assert (
        response.status_code == 400
        and "image_url content parts are not supported" in response.json()["error"]["message"]
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("refusal", "I cannot help."),
        ("annotations", [{"type": "url_citation"}]),
        ("audio", {"id": "a1"}),
        ("function_call", {"name": "f"}),
    ],
)
def test_a_message_field_the_server_cannot_honour_is_a_400_naming_it(mock_server, field, value) -> None:
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y", field: value},
        {"role": "user", "content": "z"},
    ]
    response = httpx.post(
        f"{mock_server.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=30
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"].startswith(f"messages.1.{field}: ")


def test_empty_sdk_fields_are_taken_and_a_name_reaches_the_template(mock_server) -> None:
    empty = {"refusal": None, "annotations": [], "audio": None, "function_call": None, "tool_calls": []}
    messages = [
        {"role": "user", "content": "x", "name": "alice", **empty},
        {"role": "assistant", "content": "y", **empty},
    ]
    body = {"messages": [*messages, {"role": "user", "content": "z"}], "max_tokens": 2}
    assert httpx.post(f"{mock_server.url}/v1/chat/completions", json=body, timeout=30).status_code == 200
    request = ChatCompletionRequest.model_validate(body)
    assert request.messages[0].to_template() == {"role": "user", "content": "x", "name": "alice"}
    assert (
        inline_tools([request.messages[0].to_template()], [{"type": "function", "function": {"name": "f"}}])[1]["name"]
        == "alice"
    )


def test_top_k_of_minus_1_or_0_means_no_limit(mock_server) -> None:
    for top_k in (-1, 0):  # vLLM's spellings of "every token"
        body = {"prompt": "x", "max_tokens": 2, "top_k": top_k}
        assert httpx.post(f"{mock_server.url}/v1/completions", json=body, timeout=30).status_code == 200
        assert CompletionRequest.model_validate(body).params(2, None).top_k is None
