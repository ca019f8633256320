"""The command_bridge backend: a program per request, a minimal environment, every failure a 502 with its reason."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from hetero_serve_openai.config import server_config

from .conftest import RunningServer, mock_server_config

BRIDGE = Path(__file__).resolve().parents[3] / "contrib" / "command-bridge" / "echo_bridge.py"


def test_command_bridge() -> None:
    config = mock_server_config(
        server={
            "backend": "command_bridge",
            "command": [sys.executable, str(BRIDGE)],
            "command_timeout": 2,
            "command_concurrency": 2,
        }
    )
    with RunningServer(config) as server:
        response = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": "ping", "max_tokens": 5, "temperature": 0.5}
        )
        assert response.status_code == 200
        assert response.json()["choices"][0]["text"] == "echo: ping (max_tokens=5, temperature=0.5, top_p=1.0)"
        failing = httpx.post(f"{server.url}/v1/completions", json={"prompt": "FAIL"})
        assert failing.status_code == 502 and "exited with status 3" in failing.json()["error"]["message"]
        slow = httpx.post(f"{server.url}/v1/completions", json={"prompt": "SLEEP"}, timeout=10)
        assert slow.status_code == 502 and "timed out" in slow.json()["error"]["message"]
        for fields, param in (({"echo": True, "logprobs": 1}, "logprobs"), ({"prompt_logprobs": 0}, "prompt_logprobs")):
            scoring = httpx.post(f"{server.url}/v1/completions", json={"prompt": "ping", **fields})
            assert scoring.status_code == 400 and scoring.json()["error"]["param"] == param


def test_command_bridge_without_its_program_answers_502() -> None:
    config = mock_server_config(server={"backend": "command_bridge", "command": ["/nonexistent/bridge-program"]})
    with RunningServer(config) as server:
        response = httpx.post(
            f"{server.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert response.status_code == 502
        assert "cannot run '/nonexistent/bridge-program'" in response.json()["error"]["message"]


def test_command_bridge_runs_at_most_command_concurrency_programs() -> None:
    config = mock_server_config(
        server={
            "backend": "command_bridge",
            "command": [sys.executable, str(BRIDGE)],
            "command_timeout": 1.5,
            "command_concurrency": 1,
        }
    )
    with RunningServer(config) as server:

        async def run():
            async with httpx.AsyncClient(timeout=30) as client:
                hanging = asyncio.create_task(client.post(f"{server.url}/v1/completions", json={"prompt": "SLEEP"}))
                await asyncio.sleep(0.5)  # the hanging program holds the only slot
                started = time.monotonic()
                quick = await client.post(f"{server.url}/v1/completions", json={"prompt": "ping"})
                return await hanging, quick, time.monotonic() - started

        hanging, quick, waited = asyncio.run(run())
        assert hanging.status_code == 502 and quick.status_code == 200
        assert waited >= 0.9  # it ran only once the hanging program was killed at its timeout


def test_a_nul_in_the_prompt_is_a_502_with_the_reason() -> None:
    config = mock_server_config(
        server={"backend": "command_bridge", "command": [sys.executable, str(BRIDGE)], "command_timeout": 5}
    )
    with RunningServer(config) as server:
        response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "a\u0000b"}, timeout=10)
        assert response.status_code == 502 and "NUL character" in response.json()["error"]["message"]
        chat = httpx.post(
            f"{server.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "\u0000"}]}, timeout=10
        )
        assert chat.status_code == 502
        surrogate = httpx.post(
            f"{server.url}/v1/completions",
            content=json.dumps({"prompt": "\ud800"}),
            headers={"content-type": "application/json"},
            timeout=10,
        )
        assert surrogate.status_code == 400
        assert httpx.post(f"{server.url}/v1/completions", json={"prompt": "ping"}, timeout=10).status_code == 200


def test_the_program_gets_a_minimal_environment_and_a_string_command_is_split_like_a_shell(monkeypatch) -> None:
    monkeypatch.setenv("HETERO_API_KEY", "sekret")
    monkeypatch.setenv("SOME_DATABASE_PASSWORD", "hunter2")
    command = shlex.join([sys.executable, str(BRIDGE)])
    config = mock_server_config(server={"backend": "command_bridge", "command": command, "command_timeout": 5})
    assert server_config(config).command == (sys.executable, str(BRIDGE))
    with RunningServer(config) as server:
        response = httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": "ENV"},
            headers={"authorization": "Bearer sekret"},
            timeout=10,
        )
        names = set(response.json()["choices"][0]["text"].split())
    assert "HETERO_PROMPT" in names and "PATH" in names
    assert names <= {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "TMPDIR",
        "HETERO_PROMPT",
        "HETERO_MAX_TOKENS",
        "HETERO_TEMPERATURE",
        "HETERO_TOP_P",
    }


def test_a_bridge_gets_chats_with_tools_in_the_default_convention() -> None:
    config = mock_server_config(server={"backend": "command_bridge", "command": [sys.executable, str(BRIDGE)]})
    time_tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    history = [
        {"role": "user", "content": "Time?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "noon"},
    ]
    with RunningServer(config) as server:
        body = {"messages": history, "tools": [time_tool], "max_tokens": 5}
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30).json()
        (answer,) = response["choices"]
        # the echo repeats the prompt, whose history holds a well-formed call: tool_choice auto reads it back
        assert [call["function"]["name"] for call in answer["message"]["tool_calls"]] == ["get_time"]
        assert answer["finish_reason"] == "tool_calls"
        assert (
            "<tools>" in answer["message"]["content"]
            and "<tool_response>\nnoon\n</tool_response>" in answer["message"]["content"]
        )
        with httpx.stream(
            "POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=30
        ) as streamed:
            events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
        deltas = [event["choices"][0]["delta"] for event in events]
        assert (
            "".join(d.get("content") or "" for d in deltas) == answer["message"]["content"]
        )  # no tag leaks into content
        assert [c["function"]["name"] for d in deltas for c in d.get("tool_calls", [])] == ["get_time"]
        assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
        for field, value in (
            ("continue_final_message", True),
            ("chat_template_kwargs", {"a": 1}),
            ("add_generation_prompt", False),
        ):
            refused = httpx.post(
                f"{server.url}/v1/chat/completions", json={"messages": history, field: value}, timeout=30
            )
            assert refused.status_code == 400 and refused.json()["error"]["param"] == field


def test_output_beyond_command_max_output_bytes_is_a_502_and_the_program_is_killed(tmp_path) -> None:
    flood = tmp_path / "flood.py"  # writes HETERO_PROMPT bytes, then (for "forever") keeps writing
    flood.write_text(
        "import os, sys\n"
        "size = os.environ['HETERO_PROMPT']\n"
        "if size == 'forever':\n"
        "    while True:\n"
        "        sys.stdout.write('x' * 65536)\n"
        "sys.stdout.write('x' * int(size))\n"
        "sys.stderr.write('e' * 10_000_000)\n"
    )
    config = mock_server_config(
        server={
            "backend": "command_bridge",
            "command": [sys.executable, str(flood)],
            "command_timeout": 20,
            "command_max_output_bytes": 100_000,
        }
    )
    with RunningServer(config) as server:
        exact = httpx.post(f"{server.url}/v1/completions", json={"prompt": "100000"}, timeout=30)
        assert exact.status_code == 200 and len(exact.json()["choices"][0]["text"]) == 100_000
        started = time.monotonic()
        for prompt in ("100001", "forever"):
            over = httpx.post(f"{server.url}/v1/completions", json={"prompt": prompt}, timeout=30)
            assert over.status_code == 502
            assert over.json()["error"] == {
                "message": "generation failed: the bridge program wrote more than server.command_max_output_bytes "
                "(100000) bytes",
                "type": "upstream_error",
                "param": None,
                "code": "generation_failed",
            }
        assert time.monotonic() - started < 10  # killed at the cap, not at the timeout


WEATHER = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("endpoint", "fields", "param"),
    [
        ("completions", {"logprobs": 0}, "logprobs"),
        ("completions", {"logit_bias": {"5": 10}}, "logit_bias"),
        ("completions", {"guided_json": {"type": "object"}}, "guided_json"),
        ("completions", {"guided_regex": "a+"}, "guided_regex"),
        ("completions", {"response_format": {"type": "json_object"}}, "response_format"),
        ("completions", {"stop": ["\n"]}, "stop"),
        ("completions", {"seed": 1}, "seed"),
        ("completions", {"top_k": 5}, "top_k"),
        ("completions", {"presence_penalty": 0.5}, "presence_penalty"),
        ("completions", {"skip_special_tokens": False}, "skip_special_tokens"),
        ("completions", {"prompt": [1, 2, 3]}, "prompt"),
        ("chat/completions", {"logprobs": True}, "logprobs"),
        ("chat/completions", {"logit_bias": {"5": 10}}, "logit_bias"),
        (
            "chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}},
            "response_format",
        ),
        ("chat/completions", {"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
        (
            "chat/completions",
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "weather"}}},
            "tool_choice",
        ),
        (
            "chat/completions",
            {"tools": [{"type": "function", "function": {**WEATHER["function"], "strict": True}}]},
            "tools",
        ),
        ("chat/completions", {"prompt_logprobs": 0}, "prompt_logprobs"),
    ],
)
def test_a_bridge_refuses_what_it_cannot_honour_naming_the_field(
    bridge_server: RunningServer, endpoint: str, fields: dict, param: str
) -> None:
    body = {"prompt": "ping", **fields} if endpoint == "completions" else {"messages": CHAT, **fields}
    response = httpx.post(f"{bridge_server.url}/v1/{endpoint}", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    if param != "prompt":
        assert error == {
            "message": f"{param} is not supported by this server's backend 'command_bridge'",
            "type": "invalid_request_error",
            "param": param,
            "code": "unsupported_parameter",
        }


def test_a_bridge_runs_n_programs_and_takes_the_baseline(bridge_server: RunningServer) -> None:
    body = {"prompt": "ping", "n": 2, "max_tokens": 3, "temperature": 0.2, "top_p": 0.5, "stream": False}
    response = httpx.post(f"{bridge_server.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 200
    assert [c["text"] for c in response.json()["choices"]] == [
        "echo: ping (max_tokens=3, temperature=0.2, top_p=0.5)"
    ] * 2
    chat = httpx.post(
        f"{bridge_server.url}/v1/chat/completions", json={"messages": CHAT, "tools": [WEATHER]}, timeout=30
    )
    assert chat.status_code == 200  # tool_choice auto without a strict function asks for no constraint


@pytest.fixture(scope="module")
def bridge_server() -> Iterator[RunningServer]:
    config = mock_server_config(
        server={"backend": "command_bridge", "command": [sys.executable, str(BRIDGE)], "command_timeout": 10}
    )
    with RunningServer(config) as server:
        yield server
