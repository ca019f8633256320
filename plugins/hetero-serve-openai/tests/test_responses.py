"""``POST /v1/responses`` through the official openai client, against a running server with the real embedded model."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = [pytest.mark.model, pytest.mark.integration]  # the embedded model, through the installed plugins

QUESTION = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]},
    "strict": True,
}


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


@pytest.fixture(scope="module")
def client(model_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{model_server.url}/v1", api_key="unused", max_retries=0)


def chat_answer(client: openai.OpenAI, messages: list[dict], max_tokens: int) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model="smollm2", messages=messages, max_completion_tokens=max_tokens, temperature=0
    )


def test_a_string_input_is_a_user_message_answered_as_the_chat_route_answers(client) -> None:
    response = client.responses.create(model="smollm2", input=QUESTION, max_output_tokens=20, temperature=0)
    chat = chat_answer(client, [{"role": "user", "content": QUESTION}], 20)
    assert response.id.startswith("resp_") and response.object == "response" and response.model == "smollm2"
    assert response.status == "completed" and response.incomplete_details is None and response.error is None
    assert "Paris" in response.output_text
    assert response.output_text == chat.choices[0].message.content
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert [part.type for part in message.content] == ["output_text"]
    assert response.usage.input_tokens == chat.usage.prompt_tokens == 37
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_items_and_instructions_are_the_chat_messages(client) -> None:
    items = [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]
    response = client.responses.create(
        model="smollm2", input=items, instructions="Answer in one word.", max_output_tokens=10, temperature=0
    )
    chat = chat_answer(
        client, [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}], 10
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.instructions == "Answer in one word."


def test_max_output_tokens_cut_is_incomplete(client) -> None:
    response = client.responses.create(model="smollm2", input=QUESTION, max_output_tokens=3, temperature=0)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert response.usage.output_tokens == 3


def test_store_false_is_accepted(client) -> None:
    response = client.responses.create(model="smollm2", input=QUESTION, max_output_tokens=2, temperature=0, store=False)
    assert response.usage.output_tokens == 2


def test_a_json_schema_format_is_enforced_with_its_key_order(client) -> None:
    schema = City.model_json_schema()
    schema["properties"] = {
        "name": schema["properties"]["name"],
        "country": schema["properties"]["country"],
    }  # not alphabetical
    text = {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}}
    response = client.responses.create(model="smollm2", input=QUESTION, text=text, max_output_tokens=40, temperature=0)
    assert list(json.loads(response.output_text)) == ["name", "country"]
    assert response.text.format.type == "json_schema" and response.text.format.name == "city"
    parsed = client.responses.parse(
        model="smollm2", input=QUESTION, text_format=City, max_output_tokens=40, temperature=0
    )
    assert isinstance(parsed.output_parsed, City)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_forced_call_is_a_function_call_item_and_its_output_is_answered(client, tool_choice) -> None:
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = client.responses.create(
        model="smollm2",
        input=question,
        tools=[WEATHER],
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        max_output_tokens=40,
        temperature=0,
    )
    [call] = called.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert set(json.loads(call.arguments)) == {"city"}
    assert called.status == "completed" and called.output_text == ""
    history = [
        *question,
        *called.output,
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": "21 C"}'},
    ]
    answered = client.responses.create(
        model="smollm2", input=history, tools=[WEATHER], max_output_tokens=20, temperature=0
    )
    assert answered.output[0].type == "message" and answered.output_text
    assert answered.usage.input_tokens > called.usage.input_tokens  # the call and its output are in the prompt


def test_a_stream_sends_the_events_in_order_and_its_deltas_make_the_text(client) -> None:
    whole = client.responses.create(model="smollm2", input=QUESTION, max_output_tokens=20, temperature=0)
    with client.responses.stream(model="smollm2", input=QUESTION, max_output_tokens=20, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "".join(deltas) == final.output_text == whole.output_text
    assert events[0].response.status == "in_progress" and final.status == "completed"
    assert final.id == events[0].response.id and final.usage.output_tokens == whole.usage.output_tokens


def test_a_streamed_call_sends_its_arguments_in_deltas(client) -> None:
    with client.responses.stream(
        model="smollm2",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "function_call"
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    deltas = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    [call] = final.output
    assert call.arguments == deltas == events[-3].arguments
    assert set(json.loads(call.arguments)) == {"city"}


REFUSED = [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"conversation": "conv_123"}, "conversation"),
    ({"background": True}, "background"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"truncation": "auto"}, "truncation"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"prompt_cache_key": "k"}, "prompt_cache_key"),
    ({"logit_bias": {"1": 5}}, "logit_bias"),
    ({"text": {"verbosity": "low"}}, "text"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text"),
    ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
    ({"tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "tools"),
    ({"input": []}, "input"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
        "input",
    ),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": [{"type": "item_reference", "id": "msg_123"}]}, "input"),
    (
        {
            "input": [
                {
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "x", "annotations": [{"type": "url_citation"}]}],
                }
            ]
        },
        "input",
    ),
]


@pytest.mark.parametrize(("fields", "param"), REFUSED, ids=[f"{param}-{i}" for i, (_, param) in enumerate(REFUSED)])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(model_server, fields, param) -> None:
    body = {"model": "smollm2", "input": QUESTION, "max_output_tokens": 2} | fields
    response = httpx.post(f"{model_server.url}/v1/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split(".")[0] in error["message"] or param in ("input", "tools", "tool_choice")


def test_the_client_raises_on_a_refused_field(client) -> None:
    with pytest.raises(openai.BadRequestError, match="store"):
        client.responses.create(model="smollm2", input=QUESTION, store=True)
