"""Concurrency, disconnects, limits, auth, metrics and the command bridge, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import RunningServer, mock_server_config

BRIDGE = Path(__file__).resolve().parents[2] / "contrib" / "command-bridge" / "echo_bridge.py"


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no sample {name} {labels}")


async def stream_completion(client: httpx.AsyncClient, url: str, prompt: str) -> tuple[str, str]:
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": True}
    text, reason = "", None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                reason = choice["finish_reason"] or reason
    return text, reason


def test_32_concurrent_streams_get_complete_correct_answers(model_server) -> None:
    prompts = [f"Count from {i} to {i + 5}:" for i in range(32)]
    expected = [
        httpx.post(f"{model_server.url}/v1/completions", json={"prompt": p, "max_tokens": 12, "temperature": 0}, timeout=120).json()["choices"][0]
        for p in prompts[:4]
    ]

    async def run_all():
        async with httpx.AsyncClient(timeout=300) as client:
            return await asyncio.gather(*(stream_completion(client, model_server.url, p) for p in prompts))

    results = asyncio.run(run_all())
    assert [(t, r) for t, r in results[:4]] == [(e["text"], e["finish_reason"]) for e in expected]
    assert all(reason in ("stop", "length") for _, reason in results)
    assert model_server.engine.get_memory_stats().used_blocks == 0


def test_disconnecting_clients_free_their_blocks(mock_server) -> None:
    url = mock_server.url
    aborted_before = metric(url, "vllm:request_success_total", finished_reason="abort")

    async def leave_early(client: httpx.AsyncClient) -> None:
        body = {"prompt": "x" * 20, "max_tokens": 400, "temperature": 0, "stream": True}
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break  # leave mid-stream

    async def run():
        async with httpx.AsyncClient(timeout=30) as client:
            await asyncio.gather(*(leave_early(client) for _ in range(8)))
        with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up
            async with httpx.AsyncClient(timeout=0.3) as client:
                await client.post(f"{url}/v1/completions", json={"prompt": "y", "max_tokens": 900, "temperature": 0})

    asyncio.run(run())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and mock_server.engine.get_memory_stats().used_blocks:
        time.sleep(0.05)
    assert mock_server.engine.get_memory_stats().used_blocks == 0
    assert metric(url, "vllm:request_success_total", finished_reason="abort") == aborted_before + 9


def test_metrics_count_what_was_served(mock_server) -> None:
    url = mock_server.url
    before = metric(url, "vllm:generation_tokens_total")
    finished_before = metric(url, "vllm:request_success_total", finished_reason="length")
    for _ in range(3):
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "abc", "max_tokens": 7, "temperature": 0}).status_code == 200
    assert metric(url, "vllm:generation_tokens_total") == before + 21
    assert metric(url, "vllm:request_success_total", finished_reason="length") == finished_before + 3
    assert metric(url, "vllm:time_to_first_token_seconds_count") >= 3
    assert metric(url, "vllm:num_requests_running") == 0


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b'{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
        (b'{"prompt": "x", "top_p": 0}', 400, "top_p"),
        (b'{"prompt": "x", "n": 1000}', 400, "n"),
        (b'{"prompt": []}', 400, "prompt"),
        (b'{"max_tokens": 3}', 400, "prompt"),
        (b'{"prompt": [1, 999999]}', 400, "prompt"),
        (b'{"prompt": "x", "model": "other"}', 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors(mock_server, body: bytes, status: int, param: str | None) -> None:
    response = httpx.post(f"{mock_server.url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_oversized_body_is_refused(mock_server) -> None:
    response = httpx.post(f"{mock_server.url}/v1/completions", json={"prompt": "x" * (5 * 1024 * 1024)})
    assert response.status_code == 413
    assert "larger than" in response.json()["error"]["message"]


def test_api_key_and_a_full_queue() -> None:
    config = mock_server_config(max_waiting_requests=1, server={"api_key": "sekret"})
    with RunningServer(config) as server:
        url = server.url
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{url}/healthz").status_code == 200
        headers = {"authorization": "Bearer sekret"}
        assert httpx.get(f"{url}/v1/models", headers=headers).status_code == 200
        server.engine.scheduler.waiting.append(object())  # hold the only waiting place
        try:
            response = httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, headers=headers)
        finally:
            server.engine.scheduler.waiting.clear()
        assert response.status_code == 503 and response.headers["retry-after"]


def test_tokenize_round_trip(mock_server) -> None:
    tokens = httpx.post(f"{mock_server.url}/tokenize", json={"prompt": "héllo"}).json()
    assert tokens["count"] == 6
    text = httpx.post(f"{mock_server.url}/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "héllo"


def test_command_bridge() -> None:
    config = mock_server_config(
        server={"backend": "command_bridge", "command": [sys.executable, str(BRIDGE)], "command_timeout": 2, "command_concurrency": 2}
    )
    with RunningServer(config) as server:
        response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "ping", "max_tokens": 5, "temperature": 0.5})
        assert response.status_code == 200
        assert response.json()["choices"][0]["text"] == "echo: ping (max_tokens=5, temperature=0.5, top_p=1.0)"
        failing = httpx.post(f"{server.url}/v1/completions", json={"prompt": "FAIL"})
        assert failing.status_code == 502 and "exited with status 3" in failing.json()["error"]["message"]
        slow = httpx.post(f"{server.url}/v1/completions", json={"prompt": "SLEEP"}, timeout=10)
        assert slow.status_code == 502 and "timed out" in slow.json()["error"]["message"]
