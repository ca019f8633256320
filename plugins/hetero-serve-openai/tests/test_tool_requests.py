"""Tool-calling requests on the mock executor: what is refused, and the shape of forced calls, whole and streamed.

The mock executor follows the grammar's bitmask, so forced calls are real
(valid) calls here too; what they say does not matter to these tests. Forced
calls and tool schemas compile on the installed grammar engine, so these are
integration tests.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from hetero_core.tool_prompt import TOOL_CALL_OPEN

pytestmark = pytest.mark.integration  # the llguidance plugin compiles the forced calls

TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "x"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}


def post(server, body: dict[str, Any], path: str = "/v1/chat/completions") -> httpx.Response:
    content = json.dumps(body)  # ASCII, with lone surrogates escaped as JSON allows
    return httpx.post(f"{server.url}{path}", content=content, headers={"content-type": "application/json"}, timeout=60)


def renamed(name: str) -> dict:
    return {"type": "function", "function": {**TIME["function"], "name": name}}


REFUSED = [
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools"),
    ({"tools": []}, "tools"),
    ({"tools": [TIME, TIME]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": NAMED}, "tool_choice"),
    ({"tools": [TIME], "tool_choice": "any"}, "tool_choice"),
    ({"tools": [TIME], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tools": [TIME], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [TIME], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tools"),
    ({"tools": [TIME], "structured_outputs": {"regex": "a+"}}, "tools"),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)"}}},
                    },
                }
            ],
            "tool_choice": "required",
        },
        "tools",
    ),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]}, "tools"),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": {"\udfff": {}}}},
                }
            ]
        },
        "tools",
    ),
    ({"chat_template_kwargs": {"persona": "\ud83d"}}, "chat_template_kwargs"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "call_1"}]}, "messages"),
    ({"messages": [{"role": "user", "content": None}]}, "messages"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": "x",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                }
            ]
        },
        "messages",
    ),
    (
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "code", "function": {"name": "f", "arguments": "{}"}}],
                }
            ]
        },
        "messages",
    ),
    ({"chat_template_kwargs": ["not", "an", "object"]}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"continue_final_message": True}, "continue_final_message"),
    ({"add_generation_prompt": "no"}, "add_generation_prompt"),
]


@pytest.mark.parametrize(("fields", "param"), REFUSED, ids=[f"{param}-{i}" for i, (_, param) in enumerate(REFUSED)])
def test_contradictory_or_malformed_tool_fields_are_400s_naming_them(mock_server, fields, param) -> None:
    response = post(mock_server, {"messages": ASK, "max_tokens": 4, **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


def test_tokenize_refuses_the_same_rendering_mistakes(mock_server) -> None:
    response = post(mock_server, {"messages": ASK, "continue_final_message": True}, "/tokenize")
    assert response.status_code == 400 and response.json()["error"]["param"] == "continue_final_message"


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_forced_calls_carry_ids_names_and_valid_arguments(mock_server, choice) -> None:
    body = {
        "messages": ASK,
        "tools": [TIME, renamed("other")],
        "tool_choice": choice,
        "parallel_tool_calls": False,
        "max_tokens": 120,
        "n": 2,
    }
    response = post(mock_server, body).json()
    assert len(response["choices"]) == 2
    for answer in response["choices"]:
        (call,) = answer["message"]["tool_calls"]
        assert answer["finish_reason"] == "tool_calls" and answer["message"]["content"] is None
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert (
            call["function"]["name"] in ("get_time", "other")
            if choice == "required"
            else call["function"]["name"] == "get_time"
        )
        assert json.loads(call["function"]["arguments"])["zone"] in ("UTC", "CET")


def test_forced_calls_stream_as_openai_streams_them(mock_server) -> None:
    body = {"messages": ASK, "tools": [TIME], "tool_choice": NAMED, "max_tokens": 120, "stream": True, "logprobs": True}
    with httpx.stream("POST", f"{mock_server.url}/v1/chat/completions", json=body, timeout=60) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    deltas = [event["choices"][0]["delta"] for event in events]
    assert deltas[0] == {"role": "assistant", "content": None}
    parts = [part for delta in deltas for part in delta.get("tool_calls", [])]
    assert (
        parts[0]["id"].startswith("call_")
        and parts[0]["function"]["name"] == "get_time"
        and parts[0]["type"] == "function"
    )
    assert all(part["index"] == 0 and "id" not in part for part in parts[1:]) and len(parts) > 2
    assert json.loads("".join(part["function"]["arguments"] for part in parts)) in ({"zone": "UTC"}, {"zone": "CET"})
    assert not any(delta.get("content") for delta in deltas)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    text = "".join(
        entry["token"] for event in events for entry in (event["choices"][0]["logprobs"] or {}).get("content", [])
    )
    assert text.startswith(TOOL_CALL_OPEN)  # logprobs cover every generated token, tool-call text included


def test_the_openai_stream_helper_accumulates_forced_calls(mock_server) -> None:
    client = openai.OpenAI(base_url=f"{mock_server.url}/v1", api_key="unused", max_retries=0)
    with client.beta.chat.completions.stream(
        model="mock",
        messages=ASK,
        tools=[TIME, renamed("other")],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
    ) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and json.loads(call.function.arguments)["zone"] in ("UTC", "CET")


def test_parallel_calls_stream_under_their_own_indexes(mock_server) -> None:
    client = openai.OpenAI(base_url=f"{mock_server.url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="mock", messages=ASK, tools=[TIME], tool_choice="required", max_tokens=240, stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    for chunk in stream:
        for part in chunk.choices[0].delta.tool_calls or ():
            entry = calls.setdefault(part.index, {"id": part.id, "arguments": ""})
            entry["arguments"] += part.function.arguments or ""
    assert sorted(calls) == list(range(len(calls))) and len(calls) >= 2  # the mock goes on calling until max_tokens
    assert len({entry["id"] for entry in calls.values()}) == len(calls)
    for entry in list(calls.values())[:-1]:  # the last may be cut by max_tokens
        assert json.loads(entry["arguments"])["zone"] in ("UTC", "CET")


def test_tool_choice_none_leaves_the_text_alone(mock_server) -> None:
    response = post(mock_server, {"messages": ASK, "tools": [TIME], "tool_choice": "none", "max_tokens": 5}).json()
    (answer,) = response["choices"]
    assert "tool_calls" not in answer["message"] and answer["finish_reason"] == "length"


def test_tools_and_history_reach_the_prompt(mock_server) -> None:
    history = [
        {"role": "user", "content": "What time is it in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "10:42"},
    ]
    tokens = post(mock_server, {"messages": history, "tools": [TIME]}, "/tokenize").json()["tokens"]
    text = post(mock_server, {"tokens": tokens}, "/detokenize").json()["prompt"]
    assert '"name": "get_time"' in text.split("user:")[0]  # the tools, in the system block
    assert '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>' in text
    assert "<tool_response>\n10:42\n</tool_response>" in text
    without_tools = post(mock_server, {"messages": history}, "/tokenize").json()["tokens"]
    text = post(mock_server, {"tokens": without_tools}, "/detokenize").json()["prompt"]
    assert "<tools>" not in text and "<tool_response>" in text
    answer = post(mock_server, {"messages": history, "max_tokens": 3}).json()
    assert answer["usage"]["prompt_tokens"] == len(without_tools)


def test_continue_final_message_and_no_generation_prompt(mock_server) -> None:
    chat = [*ASK, {"role": "assistant", "content": "The answer is"}]

    def rendered(**fields: Any) -> str:
        tokens = post(mock_server, {"messages": chat, **fields}, "/tokenize").json()["tokens"]
        return post(mock_server, {"tokens": tokens}, "/detokenize").json()["prompt"]

    assert rendered().endswith("The answer is\nassistant: ")
    assert rendered(add_generation_prompt=False).endswith("The answer is\n")
    assert rendered(add_generation_prompt=False, continue_final_message=True).endswith("The answer is")
    answer = post(
        mock_server, {"messages": chat, "add_generation_prompt": False, "continue_final_message": True, "max_tokens": 3}
    )
    assert (
        answer.status_code == 200
        and answer.json()["usage"]["prompt_tokens"] == len(rendered(add_generation_prompt=False)) - 1
    )


def test_a_call_cut_by_a_stop_string_does_not_claim_tool_calls(mock_server) -> None:
    body = {"messages": ASK, "tools": [TIME], "tool_choice": NAMED, "max_tokens": 120, "stop": ["zone"]}
    (answer,) = post(mock_server, body).json()["choices"]
    assert answer["finish_reason"] == "stop" and answer["message"]["tool_calls"][0]["function"]["arguments"] == '{"'
