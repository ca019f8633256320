"""Request bodies the server refuses with a precise 400 (or 413/408),
and the limits that keep one request from harming others."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from hetero_core.builtin.mock_executor import MockExecutor
from hetero_core.builtin.simple_tokenizer import SimpleTokenizer
from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.hookspecs import hookimpl
from hetero_core.plugins import create_plugin_manager

from .conftest import SERVER_PLUGIN, RunningServer, mock_server_config

CHAT = [{"role": "user", "content": "hi"}]


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None, *, says: str = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param, error
    assert says in error["message"], error
    return error


@pytest.fixture(scope="module")
def server():
    config = mock_server_config(max_waiting_requests=8, server={"model_name": "mock", "max_choices_per_request": 6})
    with RunningServer(config) as running:
        yield running


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        ("/v1/completions", {"prompt": [True, False]}, "prompt", "list of token ids"),
        ("/v1/completions", {"prompt": [[1, True]]}, "prompt", "list of token ids"),
        ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs", ""),
        ("/v1/completions", {"prompt": "x", "ignore_eos": "yes"}, "ignore_eos", "boolean"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2.5}, "max_tokens", "integer"),
        ("/v1/completions", {"prompt": "x", "stop": "\ud800"}, "stop", "lone surrogate"),
        ("/v1/completions", {"prompt": "x", "stop": ["ok", "\udfff"]}, "stop", "lone surrogate"),
        ("/v1/completions", {"prompt": "x\ud800"}, "prompt", "lone surrogate"),
        ("/v1/completions", {"prompt": "x", "stop_token_ids": [259]}, "stop_token_ids", "[0, 259)"),
        ("/v1/completions", {"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids", ""),
        ("/v1/completions", {"prompt": ["a"] * 9}, "prompt", "max_waiting_requests (8)"),
        ("/v1/completions", {"prompt": ["a", "b"], "n": 4}, "n", "server.max_choices_per_request (6)"),
        ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0}, "max_completion_tokens", "at least 1"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages", "'user'"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud83d"}]}, "messages", "lone surrogate"),
        ("/v1/chat/completions", {"messages": CHAT, "n": 7}, "n", "server.max_choices_per_request (6)"),
        ("/v1/chat/completions", {"messages": CHAT, "stop_token_ids": [10**30]}, "stop_token_ids", ""),
    ],
)
def test_invalid_fields_are_400s_naming_the_field(server, path: str, body: dict, param: str, says: str) -> None:
    content = json.dumps(body)  # ASCII, with lone surrogates escaped as JSON allows
    response = httpx.post(
        f"{server.url}{path}", content=content, headers={"content-type": "application/json"}, timeout=30
    )
    assert_openai_error(response, 400, param, says=says)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(server, literal: str) -> None:
    body = f'{{"prompt": "x", "temperature": {literal}}}'.encode()
    response = httpx.post(f"{server.url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert_openai_error(response, 400, "temperature", says="finite")


def test_developer_messages_are_system_messages(server) -> None:
    as_system = {"messages": [{"role": "system", "content": "be brief"}, *CHAT], "max_tokens": 4, "temperature": 0}
    as_developer = {**as_system, "messages": [{"role": "developer", "content": "be brief"}, *CHAT]}
    system = httpx.post(f"{server.url}/v1/chat/completions", json=as_system).json()
    developer = httpx.post(f"{server.url}/v1/chat/completions", json=as_developer).json()
    assert developer["choices"] == system["choices"] and developer["usage"] == system["usage"]


def test_a_request_at_the_choice_limit_is_served(server) -> None:
    response = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 3}, timeout=30
    )
    assert response.status_code == 200 and len(response.json()["choices"]) == 6


def test_an_oversized_chunked_body_is_413(server) -> None:
    def chunks():
        for _ in range(6):
            yield b"x" * (1024 * 1024)

    response = httpx.post(
        f"{server.url}/v1/completions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_openai_error(response, 413, says="larger than")


class GatedTokenizer(SimpleTokenizer):
    """The simple tokenizer, except that encoding a long text waits until the test opens the gate."""

    gate = threading.Event()

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if len(text) > 1000:
            assert self.gate.wait(30)
        return super().encode(text, add_special_tokens=add_special_tokens)


class GatedTokenizerPlugin:
    @hookimpl
    def register_tokenizers(self, register) -> None:
        register("gated", GatedTokenizer)


def test_tokenizing_a_large_prompt_does_not_block_the_event_loop() -> None:
    def build(config: EngineConfig) -> InferenceEngine:
        pm = create_plugin_manager(entry_points=False, load=[SERVER_PLUGIN, *config.plugins.load])
        pm.register(GatedTokenizerPlugin())
        return InferenceEngine(config, plugin_manager=pm)

    config = mock_server_config(tokenizer="gated", max_model_len=8192, max_num_blocks=4096)
    with RunningServer(config, engine_factory=build) as server:
        GatedTokenizer.gate.clear()
        body = {"prompt": "y" * 5000, "max_tokens": 2}
        result: dict[str, Any] = {}
        poster = threading.Thread(
            target=lambda: result.update(response=httpx.post(f"{server.url}/v1/completions", json=body, timeout=60))
        )
        poster.start()
        time.sleep(0.3)  # the big request is now inside encode(), waiting at the gate
        assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
        chat = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}, timeout=5)
        assert chat.status_code == 200
        GatedTokenizer.gate.set()
        poster.join(60)
        assert result["response"].status_code == 200


class NonFiniteLogprobs(MockExecutor):
    """The mock executor breaking its contract: an alternative's logprob is -inf,
    and NaN for prompts starting with '!'."""

    def execute(self, batch: Any) -> Any:
        output = super().execute(batch)
        for seq in batch.sequences:
            entry = output.logprobs.get(seq.seq_id)
            if entry is not None:
                entry.top[-1] = (entry.top[-1][0], -math.inf)
                if seq.all_token_ids[0] == ord("!"):
                    entry.logprob = math.nan
        return output


class NonFinitePlugin:
    @hookimpl
    def register_executors(self, register) -> None:
        register("non-finite", NonFiniteLogprobs)


def test_no_non_finite_number_reaches_a_response() -> None:
    def build(config: EngineConfig) -> InferenceEngine:
        pm = create_plugin_manager(entry_points=False, load=[SERVER_PLUGIN, *config.plugins.load])
        pm.register(NonFinitePlugin())
        return InferenceEngine(config, plugin_manager=pm)

    config = mock_server_config(executor={"name": "non-finite", "vocab_size": 128})
    with RunningServer(config, engine_factory=build) as server:
        url = f"{server.url}/v1/completions"
        ruled_out = httpx.post(url, json={"prompt": "ok", "max_tokens": 3, "logprobs": 2}, timeout=30)
        assert ruled_out.status_code == 500 and "Infinity" not in ruled_out.text  # the executor broke its contract
        nan = httpx.post(url, json={"prompt": "!bad", "max_tokens": 3, "logprobs": 2}, timeout=30)
        assert nan.status_code == 500 and "NaN" not in nan.text
        with httpx.stream(
            "POST", url, json={"prompt": "!bad", "max_tokens": 3, "logprobs": 2, "stream": True}, timeout=30
        ) as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and "NaN" not in "".join(lines)
        assert json.loads(lines[-2][6:])["error"]["code"] == "internal_error"
        assert server.engine.get_memory_stats().used_blocks == 0


def test_a_request_body_that_trickles_in_is_cut_with_408() -> None:
    config = mock_server_config(server={"read_timeout": 0.5})
    with RunningServer(config) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 100\r\n\r\n{"
            )
            started = time.monotonic()
            answer = b""
            while chunk := connection.recv(65536):  # the server answers, then closes
                answer += chunk
            assert time.monotonic() - started < 5
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in answer
