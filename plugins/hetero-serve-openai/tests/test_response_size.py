"""Responses that logprobs would blow up: prompt logprobs sent once per prompt,
and a size estimated and refused before any work."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from hetero_serve_openai.response_size import chat_size, completion_size

from .conftest import RunningServer, mock_server_config

CHAT = [{"role": "user", "content": "hi"}]


def completions(server: RunningServer, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)


def assert_refused(response: httpx.Response, param: str, limit: int) -> None:
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert f"over server.max_response_bytes ({limit:,})" in error["message"], error


def test_echoing_a_long_prompt_with_logprobs_to_64_choices_is_refused_before_any_work(mock_server) -> None:
    body = {"prompt": "x" * 2000, "prompt_logprobs": 20, "echo": True, "logprobs": 20, "n": 64}
    submitted = mock_server.engine.metrics.prompt_tokens
    started = time.monotonic()
    response = completions(mock_server, body)
    assert_refused(response, "echo", 32 * 1024 * 1024)
    assert (
        time.monotonic() - started < 5 and mock_server.engine.metrics.prompt_tokens == submitted
    )  # nothing reached the engine


def test_prompt_logprobs_come_once_per_prompt(mock_server) -> None:
    body = {"prompt": ["abc", "defg"], "n": 3, "max_tokens": 2, "prompt_logprobs": 1}
    choices = completions(mock_server, body).json()["choices"]
    scored = {c["index"]: c["prompt_logprobs"] for c in choices}
    assert [index for index, value in sorted(scored.items()) if value is not None] == [0, 3]
    assert len(scored[0]) == 3 and len(scored[3]) == 4
    with httpx.stream(
        "POST", f"{mock_server.url}/v1/completions", json={**body, "stream": True}, timeout=30
    ) as response:
        chunks = [json.loads(line[6:])["choices"][0] for line in response.iter_lines() if line.startswith("data: {")]
    firsts = {}
    for chunk in chunks:
        firsts.setdefault(chunk["index"], chunk)
    assert {i: c["prompt_logprobs"] for i, c in firsts.items()} == scored


@pytest.fixture(scope="module")
def small_server():
    config = mock_server_config(server={"model_name": "mock", "max_response_bytes": 50_000})
    with RunningServer(config) as running:
        yield running


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/chat/completions", {"max_tokens": 200, "logprobs": True, "top_logprobs": 5}, "top_logprobs"),
        ("/v1/chat/completions", {"max_completion_tokens": 2000, "stream": True}, "max_completion_tokens"),
        ("/v1/chat/completions", {"max_tokens": 1000, "n": 8}, "max_tokens"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "y" * 1000}], "max_tokens": 1, "prompt_logprobs": 1},
            "prompt_logprobs",
        ),
        ("/v1/completions", {"max_tokens": 200, "logprobs": 10}, "logprobs"),
        ("/v1/completions", {"max_tokens": 2000, "n": 4}, "max_tokens"),
        ("/v1/completions", {"prompt": "y" * 1000, "max_tokens": 1, "echo": True, "logprobs": 2}, "echo"),
        ("/v1/completions", {"prompt": "y" * 1000, "max_tokens": 1, "prompt_logprobs": 1}, "prompt_logprobs"),
    ],
)
def test_a_configured_limit_names_the_field_that_fills_the_response(small_server, path, fields, param) -> None:
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": CHAT}
    response = httpx.post(f"{small_server.url}{path}", json={**body, **fields}, timeout=60)
    assert_refused(response, param, 50_000)


def test_under_the_configured_limit_a_request_runs(small_server) -> None:
    response = completions(small_server, {"prompt": "x", "max_tokens": 20, "logprobs": 5, "n": 2})
    assert response.status_code == 200 and len(response.content) < 50_000


BODIES = [
    ("/v1/completions", {"max_tokens": 40, "logprobs": 20, "echo": True, "prompt_logprobs": 20, "n": 2}),
    ("/v1/completions", {"max_tokens": 40, "logprobs": 5, "stream": True}),
    ("/v1/chat/completions", {"max_tokens": 40, "logprobs": True, "top_logprobs": 20, "prompt_logprobs": 5}),
    ("/v1/chat/completions", {"max_tokens": 40, "logprobs": True, "top_logprobs": 0, "stream": True, "n": 2}),
]


@pytest.mark.model
@pytest.mark.integration
@pytest.mark.parametrize(("path", "fields"), BODIES, ids=[f"{i}" for i in range(len(BODIES))])
def test_the_estimate_bounds_real_responses_closely(model_server, path, fields) -> None:
    prompt = "The history of the city of Paris begins with a small settlement on an island in the Seine. " * 3
    tokenizer = model_server.engine.tokenizer
    body = {"ignore_eos": True, "temperature": 1.0, "seed": 1, **fields}
    if path == "/v1/completions":
        body["prompt"] = prompt
        ids = tokenizer.encode(prompt)
        estimate = completion_size(
            [(len(ids), len(prompt))],
            n=body.get("n", 1),
            max_tokens=40,
            logprobs=body.get("logprobs"),
            echo=body.get("echo", False),
            prompt_logprobs=body.get("prompt_logprobs"),
            stream=body.get("stream", False),
        )
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
        num_prompt_tokens = len(
            httpx.post(f"{model_server.url}/tokenize", json={"messages": body["messages"]}, timeout=60).json()["tokens"]
        )
        estimate = chat_size(
            num_prompt_tokens,
            n=body.get("n", 1),
            max_tokens=40,
            max_tokens_field="max_tokens",
            top_logprobs=body["top_logprobs"],
            prompt_logprobs=body.get("prompt_logprobs"),
            stream=body.get("stream", False),
        )
    response = httpx.post(f"{model_server.url}{path}", json=body, timeout=120)
    assert response.status_code == 200, response.text[:300]
    assert len(response.content) <= estimate.num_bytes <= 2 * len(response.content), (len(response.content), estimate)
