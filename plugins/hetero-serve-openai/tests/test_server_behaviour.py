"""Concurrency, disconnects, limits and metrics, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import RunningServer, mock_server_config


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


@pytest.mark.model
@pytest.mark.integration
def test_32_concurrent_streams_get_complete_correct_answers(model_server) -> None:
    prompts = [f"Count from {i} to {i + 5}:" for i in range(32)]
    whole = httpx.post(
        f"{model_server.url}/v1/completions", json={"prompt": prompts, "max_tokens": 12, "temperature": 0}, timeout=300
    )
    expected = sorted(whole.json()["choices"], key=lambda c: c["index"])

    async def run_all():
        async with httpx.AsyncClient(timeout=300) as client:
            return await asyncio.gather(*(stream_completion(client, model_server.url, p) for p in prompts))

    results = asyncio.run(run_all())
    assert results == [(e["text"], e["finish_reason"]) for e in expected]
    assert all(reason in ("stop", "length") and text for text, reason in results)
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
    counters = {
        "generation": ("vllm:generation_tokens_total", {}),
        "prompt": ("vllm:prompt_tokens_total", {}),
        "length": ("vllm:request_success_total", {"finished_reason": "length"}),
        "ttft": ("vllm:time_to_first_token_seconds_count", {}),
        "itl": ("vllm:inter_token_latency_seconds_count", {}),
        "tpot": ("vllm:time_per_output_token_seconds_count", {}),
        "request_tpot": ("vllm:request_time_per_output_token_seconds_count", {}),
        "e2e": ("vllm:e2e_request_latency_seconds_count", {}),
    }
    before = {key: metric(url, name, **labels) for key, (name, labels) in counters.items()}
    for _ in range(3):
        response = httpx.post(f"{url}/v1/completions", json={"prompt": "abc", "max_tokens": 7, "temperature": 0})
        assert response.status_code == 200
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    grown = {key: metric(url, name, **labels) - before[key] for key, (name, labels) in counters.items()}
    assert grown == {
        "generation": 21,
        "prompt": 3 * prompt_tokens,
        "length": 3,
        "ttft": 3,
        "itl": 18,
        "tpot": 18,
        "request_tpot": 3,
        "e2e": 3,
    }
    assert metric(url, "vllm:num_requests_running") == 0 and metric(url, "vllm:num_requests_waiting") == 0
    assert 0 <= metric(url, "vllm:kv_cache_usage_perc") <= 1


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
    response = httpx.post(
        f"{mock_server.url}/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_oversized_body_is_refused(mock_server) -> None:
    response = httpx.post(f"{mock_server.url}/v1/completions", json={"prompt": "x" * (5 * 1024 * 1024)})
    assert response.status_code == 413
    assert "larger than" in response.json()["error"]["message"]


def test_a_full_waiting_queue_answers_503_with_retry_after() -> None:
    config = mock_server_config(
        executor={"name": "mock", "vocab_size": 128, "step_latency": 0.01}, max_num_seqs=1, max_waiting_requests=1
    )
    with RunningServer(config) as server:
        url, metrics = server.url, server.engine.metrics

        async def until(condition) -> None:
            deadline = time.monotonic() + 10
            while not condition() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

        async def run():
            async with httpx.AsyncClient(timeout=30) as client:
                long_body = {"prompt": "x", "max_tokens": 300}
                running = asyncio.create_task(client.post(f"{url}/v1/completions", json=long_body))
                await until(lambda: metrics.num_running == 1)  # it holds the only sequence slot
                waiting = asyncio.create_task(client.post(f"{url}/v1/completions", json=long_body))
                await until(lambda: metrics.num_waiting == 1)  # ... and this one the only waiting place
                refused = await client.post(f"{url}/v1/completions", json={"prompt": "z"})
                running.cancel()
                waiting.cancel()
                return refused

        refused = asyncio.run(run())
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert "waiting queue is full" in refused.json()["error"]["message"]


def test_tokenize_round_trip(mock_server) -> None:
    tokens = httpx.post(f"{mock_server.url}/tokenize", json={"prompt": "héllo"}).json()
    assert tokens["count"] == 6
    text = httpx.post(f"{mock_server.url}/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "héllo"


def test_tokenize_takes_a_prompt_or_messages_not_both(mock_server) -> None:
    both = {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}
    response = httpx.post(f"{mock_server.url}/tokenize", json=both)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"


def test_a_body_declared_by_both_content_length_and_transfer_encoding_is_refused(mock_server) -> None:
    body = b'{"prompt": "x", "max_tokens": 2}'
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", int(mock_server.url.rsplit(":", 1)[1])), timeout=10) as connection:
        connection.sendall(head.encode() + chunked)
        status_line = connection.makefile("rb").readline()
    assert status_line.split()[1] == b"400", status_line
