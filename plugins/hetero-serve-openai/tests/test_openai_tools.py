"""Tool calling with the official openai client on the real model: forced calls always valid, history in the prompt."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pydantic
import pytest
from langchain_openai import ChatOpenAI

from hetero_core.tool_prompt import TOOL_CALL_OPEN

pytestmark = [pytest.mark.model, pytest.mark.integration]  # the embedded model, through the installed plugins

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"hours_ahead": {"type": "integer", "minimum": 0, "maximum": 12}},
            "required": ["hours_ahead"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in (WEATHER, TIME)}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client(model_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{model_server.url}/v1", api_key="unused", max_retries=0)


def check(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_returns_one_valid_call(client, temperature) -> None:
    response = client.chat.completions.create(
        model="smollm2",
        messages=QUESTION,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=48,
        temperature=temperature,
        seed=7,
    )
    choice = response.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert call.id.startswith("call_") and call.type == "function"
    check(call.function.name, call.function.arguments)


def test_a_named_function_streams_valid_arguments(client) -> None:
    stream = client.chat.completions.create(
        model="smollm2",
        messages=QUESTION,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=48,
        temperature=0.7,
        seed=3,
        stream=True,
    )
    chunks = list(stream)
    parts = [part for chunk in chunks for part in chunk.choices[0].delta.tool_calls or ()]
    assert parts[0].id.startswith("call_") and parts[0].function.name == "get_time"
    assert {part.index for part in parts} == {0}
    check("get_time", "".join(part.function.arguments or "" for part in parts))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(chunk.choices[0].delta.content for chunk in chunks)


@pytest.mark.parametrize("strict", [True, False])
def test_a_strict_function_gets_only_its_listed_arguments_at_every_depth(client, model_server, strict) -> None:
    digit = {
        "type": "object",
        "properties": {"digit": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["digit"],
    }
    pick = {"name": "pick", "parameters": {"type": "object", "properties": {"choice": digit}, "required": ["choice"]}}
    tokenizer = model_server.engine.tokenizer
    more_keys = {
        str(tokenizer.encode(text, add_special_tokens=False)[0]): 100 for text in (",", ", ")
    }  # another key, if allowed
    response = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Pick a digit."}],
        max_tokens=40,
        temperature=0,
        logit_bias=more_keys,
        tools=[{"type": "function", "function": {**pick, "strict": strict}}],
        tool_choice={"type": "function", "function": {"name": "pick"}},
    )
    (call,) = response.choices[0].message.tool_calls
    arguments = call.function.arguments
    if strict:  # OpenAI's strict mode: no keys but the listed ones, nested objects too
        assert list(json.loads(arguments)) == ["choice"] and list(json.loads(arguments)["choice"]) == ["digit"], (
            arguments
        )
    else:  # the declared parameters at the top, JSON Schema as written below
        assert re.match(r'\{"choice": \{"digit": \d, "', arguments), arguments


def test_under_auto_a_call_of_a_strict_function_is_constrained_once_opened(client, model_server) -> None:
    pick = {
        "name": "pick",
        "strict": True,
        "parameters": {"type": "object", "properties": {"digit": {"type": "integer", "minimum": 0, "maximum": 9}}},
    }
    tokenizer = model_server.engine.tokenizer
    tempting = {
        str(token_id): 100 for token_id in tokenizer.encode("<tool_call>", add_special_tokens=False)
    }  # open a call
    tempting |= {
        str(tokenizer.encode(text, add_special_tokens=False)[0]): 100 for text in (",", ", ")
    }  # then add keys, if allowed
    response = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Pick a digit."}],
        max_tokens=40,
        temperature=0,
        logit_bias=tempting,
        tools=[{"type": "function", "function": pick}],
        tool_choice="auto",
        parallel_tool_calls=False,
    )
    choice = response.choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "pick" and set(json.loads(call.function.arguments)) <= {"digit"}, (
        call.function.arguments
    )
    assert TOOL_CALL_OPEN not in (choice.message.content or "")


def test_a_tool_conversation_renders_into_the_prompt(client, model_server) -> None:
    arguments = '{"city": "Paris", "unit": "celsius"}'
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_7", "content": "18 degrees, light rain"},
    ]
    tokens = httpx.post(
        f"{model_server.url}/tokenize", json={"messages": history, "tools": [WEATHER]}, timeout=60
    ).json()["tokens"]
    text = httpx.post(f"{model_server.url}/detokenize", json={"tokens": tokens}, timeout=60).json()["prompt"]
    assert text.startswith("<|im_start|>system\nYou can call functions") and '"name": "get_weather"' in text
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call><|im_end|>' in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\n18 degrees, light rain\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        in text
    )
    without_tools = httpx.post(f"{model_server.url}/tokenize", json={"messages": history}, timeout=60).json()["count"]
    answer = client.chat.completions.create(
        model="smollm2", messages=history, tools=[WEATHER], tool_choice="none", max_tokens=4, temperature=0
    )
    assert answer.usage.prompt_tokens == without_tools < len(tokens)  # with tool_choice none the tools are not shown


def test_continue_final_message_continues_the_assistant_turn(client, model_server) -> None:
    chat = [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "A fruit that is yellow is the"},
    ]
    body = {"messages": chat, "add_generation_prompt": False, "continue_final_message": True}
    tokens = httpx.post(f"{model_server.url}/tokenize", json=body, timeout=60).json()["tokens"]
    text = httpx.post(f"{model_server.url}/detokenize", json={"tokens": tokens}, timeout=60).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\nA fruit that is yellow is the")
    answer = client.chat.completions.create(
        model="smollm2", messages=chat, max_tokens=3, temperature=0, extra_body=body
    )
    assert answer.usage.prompt_tokens == len(tokens)


class GetWeather(pydantic.BaseModel):
    """The current weather in a city."""

    city: str = pydantic.Field(max_length=24)


def test_langchain_bind_tools_and_structured_output_by_function_calling(model_server) -> None:
    llm = ChatOpenAI(
        base_url=f"{model_server.url}/v1",
        api_key="unused",
        model="smollm2",
        temperature=0,
        max_tokens=40,
        max_retries=0,
    )
    (call,) = llm.bind_tools([GetWeather], tool_choice="any").invoke("What is the weather in Paris?").tool_calls
    assert call["name"] == "GetWeather" and set(call["args"]) == {"city"} and call["id"].startswith("call_")
    chunks = list(llm.bind_tools([GetWeather], tool_choice="GetWeather").stream("And in Rome?"))
    streamed = sum(chunks[1:], chunks[0])
    assert [c["name"] for c in streamed.tool_calls] == ["GetWeather"] and set(streamed.tool_calls[0]["args"]) == {
        "city"
    }
    assert isinstance(
        llm.with_structured_output(GetWeather, method="function_calling").invoke("Weather in Oslo?"), GetWeather
    )


def test_langchain_structured_output_by_json_schema(model_server) -> None:
    llm = ChatOpenAI(
        base_url=f"{model_server.url}/v1",
        api_key="unused",
        model="smollm2",
        temperature=0,
        max_tokens=40,
        max_retries=0,
    )
    answer = llm.with_structured_output(GetWeather, method="json_schema", strict=True).invoke("Weather in Oslo?")
    assert isinstance(answer, GetWeather) and 0 < len(answer.city) <= 24


@pytest.mark.parametrize("stream", [False, True])
def test_auto_answers_in_text_or_in_valid_calls_and_never_leaks_the_tags(client, stream) -> None:
    """Under ``auto`` the model chooses; whichever it chose, the client gets content or well-formed calls,
    never the convention's tags."""
    messages = [{"role": "system", "content": "Call get_weather to answer questions about the weather."}, *QUESTION]
    request = dict(
        model="smollm2", messages=messages, tools=[WEATHER, TIME], tool_choice="auto", max_tokens=64, temperature=0
    )
    if stream:
        chunks = list(client.chat.completions.create(**request, stream=True))
        content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        calls: dict[int, list] = {}
        for part in (p for chunk in chunks for p in chunk.choices[0].delta.tool_calls or ()):
            calls.setdefault(part.index, []).append(part)
        called = [
            (parts[0].function.name, "".join(p.function.arguments or "" for p in parts)) for parts in calls.values()
        ]
        finish_reason = chunks[-1].choices[0].finish_reason
    else:
        choice = client.chat.completions.create(**request).choices[0]
        content = choice.message.content or ""
        called = [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or ()]
        finish_reason = choice.finish_reason
    assert "<tool_call>" not in content and "</tool_call>" not in content
    for name, arguments in called:
        assert name in SCHEMAS
        json.loads(arguments)  # a parsed call carries JSON arguments
    assert finish_reason in (("tool_calls", "length") if called else ("stop", "length"))
