"""Hypothesis-generated request bodies against a live server: a bad request harms only itself.

Whatever the body, the answer is never a 5xx, an error always has OpenAI's
shape, every JSON document (response or stream event) is strict JSON with
finite numbers, a well-formed request running alongside gets exactly the
tokens it gets alone, and every KV block is free afterwards.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import RunningServer, mock_server_config

BIG = [2**31, 2**63, 2**64, 10**30, -(2**63) - 1]
WORDS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
TEXT = st.one_of(st.text(max_size=12), st.sampled_from(["", "\x00", "\ud800", "a\udfffb", "\U0001f600", "x" * 300]))
NUMBER = st.one_of(
    st.integers(-3, 70),
    st.sampled_from(BIG),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1e-38, 1e-300, 5e-324, 1e308, -0.0]),
)
TOKEN_IDS = st.lists(st.one_of(st.integers(-1, 300), st.sampled_from(BIG), st.booleans()), max_size=5)
ADVERSARIAL = st.one_of(
    st.none(),
    st.booleans(),
    NUMBER,
    TEXT,
    TOKEN_IDS,
    st.lists(TOKEN_IDS, max_size=2),
    st.lists(TEXT, max_size=3),
    st.just({"a": 1}),
)

# Well-formed fields; each example then has up to two of its fields replaced by an adversarial value.
SAMPLING = {
    "max_tokens": st.integers(1, 8),
    "temperature": st.one_of(st.just(0), st.floats(0, 2)),
    "top_p": st.floats(0.01, 1),
    "top_k": st.one_of(st.sampled_from([-1, 0]), st.integers(1, 100)),
    "min_p": st.floats(0, 1),
    "n": st.integers(1, 4),
    "stop": st.one_of(WORDS, st.lists(WORDS, max_size=3)),
    "stop_token_ids": st.lists(st.integers(0, 258), max_size=3),
    "seed": st.integers(0, 2**63 - 1),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.01, 2),
    "ignore_eos": st.booleans(),
    "min_tokens": st.integers(0, 1),
    "priority": st.integers(-10, 10),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "user": WORDS,
    "model": st.just("mock"),
}
PROMPT = st.one_of(
    WORDS, st.lists(WORDS, min_size=1, max_size=3), st.lists(st.integers(0, 127), min_size=1, max_size=5)
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user", "assistant"])},
        optional={
            "content": st.one_of(
                WORDS, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": WORDS}), max_size=2)
            )
        },
    ),
    min_size=1,
    max_size=3,
)
COMPLETION = st.fixed_dictionaries(
    {"prompt": PROMPT}, optional={**SAMPLING, "logprobs": st.integers(0, 5), "echo": st.booleans()}
)
CHAT = st.fixed_dictionaries(
    {"messages": MESSAGES},
    optional={
        **SAMPLING,
        "max_completion_tokens": st.integers(1, 8),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 5),
    },
)
FIELDS = [*SAMPLING, "prompt", "messages", "logprobs", "echo", "max_completion_tokens", "top_logprobs", "unknown_field"]
MUTATIONS = st.lists(st.tuples(st.sampled_from(FIELDS), ADVERSARIAL), max_size=2)
BODIES = st.builds(
    lambda case, mutations: (case[0], {**case[1], **dict(mutations)}),
    st.one_of(st.tuples(st.just("/v1/completions"), COMPLETION), st.tuples(st.just("/v1/chat/completions"), CHAT)),
    MUTATIONS,
)
WELL_FORMED = {"prompt": "the same every time", "max_tokens": 24, "temperature": 0}


def strict_json(text: str) -> Any:
    """Parse as a strict client would: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"non-finite number {constant} in {text[:200]!r}")

    return json.loads(text, parse_constant=refuse)


def assert_error_shape(document: Any) -> None:
    assert set(document) == {"error"}, document
    error = document["error"]
    assert (
        set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str) and error["message"]
    ), error


def check_answer(path: str, body: Any) -> None:
    """Send ``body`` (NaN and lone surrogates included, as JSON allows) and check what comes back."""
    content = json.dumps(body)
    headers = {"content-type": "application/json"}
    with httpx.stream("POST", f"{URL}{path}", content=content, headers=headers, timeout=60) as response:
        text = response.read().decode()
    assert response.status_code < 500, f"{path} {content[:300]} -> {response.status_code}: {text[:300]}"
    if response.status_code >= 400:
        assert_error_shape(strict_json(text))
        return
    if not response.headers["content-type"].startswith("text/event-stream"):
        assert "choices" in strict_json(text)
        return
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", text[-300:]
    for event in events[:-1]:
        document = strict_json(event)
        if "error" in document:
            assert_error_shape(document)
            assert not document["error"]["type"] == "internal_error", document


URL = ""


class Bystander:
    """Sends the same well-formed greedy request over and over, and records any answer that differs from the first."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.expected = httpx.post(f"{url}/v1/completions", json=WELL_FORMED, timeout=30).json()["choices"]
        self.differences: list[Any] = []
        self.num_checked = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                response = client.post(f"{self.url}/v1/completions", json=WELL_FORMED)
                choices = response.json().get("choices") if response.status_code == 200 else response.text
                if choices != self.expected:
                    self.differences.append(choices)
                self.num_checked += 1

    def __enter__(self) -> Bystander:
        self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        self._thread.join(60)


def wait_for_free_blocks(server: RunningServer) -> None:
    deadline = time.monotonic() + 10
    while server.engine.get_memory_stats().used_blocks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.engine.get_memory_stats().used_blocks == 0


@pytest.fixture(scope="module")
def server():
    config = mock_server_config(
        executor={"name": "mock", "vocab_size": 128, "step_latency": 0.001},
        max_model_len=256,
        max_waiting_requests=32,
        server={"model_name": "mock", "max_choices_per_request": 16},
    )
    with RunningServer(config) as running:
        yield running


def test_no_body_harms_the_server_or_a_bystander(server) -> None:
    global URL
    URL = server.url
    with Bystander(server.url) as bystander:

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(BODIES)
        def fuzz(case: tuple[str, Any]) -> None:
            check_answer(*case)

        fuzz()
    assert bystander.num_checked > 0 and bystander.differences == []
    wait_for_free_blocks(server)


@pytest.mark.model
@pytest.mark.integration
@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "max_tokens": 2, "seed": 2**64},
        {"prompt": "x", "max_tokens": 3, "temperature": 1e-38},
        {"prompt": "x", "max_tokens": 3, "frequency_penalty": 2, "presence_penalty": -2, "logprobs": 5},
        {"prompt": [[1, 2], "two"], "max_tokens": 2, "n": 2, "echo": True, "logprobs": 1},
        {"prompt": "x", "max_tokens": 2, "stop_token_ids": [49152]},
    ],
)
def test_adversarial_bodies_on_the_real_model(model_server, body: dict) -> None:
    global URL
    URL = model_server.url
    check_answer("/v1/completions", body)
    wait_for_free_blocks(model_server)


@pytest.mark.model
@pytest.mark.integration
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "max_tokens": 2, "top_k": 9223372036854775808}, "top_k"),
        ({"prompt": "x", "max_tokens": 2, "top_k": 49153}, "top_k"),
        ({"prompt": "x", "max_tokens": 3, "repetition_penalty": 1e-300, "logprobs": 3}, "repetition_penalty"),
        (
            {"prompt": "x", "max_tokens": 3, "repetition_penalty": 1e-300, "logprobs": 3, "stream": True},
            "repetition_penalty",
        ),
    ],
)
def test_what_no_sampler_could_take_is_a_400_on_the_real_model(model_server, body: dict, param: str) -> None:
    """Values that once overflowed the sampler or made its logprobs NaN are refused, naming the field; others run on."""
    response = httpx.post(f"{model_server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert_error_shape(strict_json(response.text))
    assert response.json()["error"]["param"] == param
    fine = httpx.post(
        f"{model_server.url}/v1/completions",
        json={"prompt": "x", "max_tokens": 2, "top_k": 49152, "logprobs": 3},
        timeout=60,
    )
    assert fine.status_code == 200 and strict_json(fine.text)["choices"][0]["logprobs"]
    wait_for_free_blocks(model_server)
