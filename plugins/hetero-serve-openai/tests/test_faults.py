"""Readiness and faults: a slow or failed engine build, a failing executor, a faulty engine step."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import httpx
from fastapi.testclient import TestClient

from hetero_core.builtin.mock_executor import MockExecutor
from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.errors import ConfigError
from hetero_core.hookspecs import hookimpl
from hetero_core.plugins import create_plugin_manager
from hetero_serve_openai.app import create_app

from .conftest import SERVER_PLUGIN, RunningServer, mock_server_config

POISON = [7, 7, 7, 7]  # a prompt the failing executor refuses


class FailingExecutor(MockExecutor):
    """The mock executor, except that every batch holding a POISON prompt raises."""

    def execute(self, batch: Any) -> Any:
        if any(s.all_token_ids[: len(POISON)] == POISON for s in batch.sequences):
            raise RuntimeError("injected executor fault")
        return super().execute(batch)


class FailingExecutorPlugin:
    @hookimpl
    def register_executors(self, register) -> None:
        register("failing", FailingExecutor)


class StumblingEngine(InferenceEngine):
    """An engine whose next ``faults`` steps raise, as a bug in a component would."""

    faults = 0

    def step(self):
        if self.faults:
            self.faults -= 1
            raise RuntimeError("injected step fault")
        return super().step()


def stream_events(url: str, body: dict) -> list[Any]:
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=30) as response:
        assert response.status_code == 200
        return [
            json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]


def assert_internal_error(body: dict) -> None:
    """A 500 names a logged id, never the internal exception's text."""
    assert re.fullmatch(r"internal error \(id [0-9a-f]{12}\)", body["error"]["message"]), body
    assert "injected" not in json.dumps(body)


def test_readyz_is_503_until_the_engine_is_built() -> None:
    built = threading.Event()

    def slow_build(config: EngineConfig) -> InferenceEngine:
        built.wait(30)
        return InferenceEngine(config)

    server = RunningServer(mock_server_config(), engine_factory=slow_build).start(until="/healthz")
    try:
        assert httpx.get(f"{server.url}/readyz").status_code == 503
        loading = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x"})
        assert loading.status_code == 503 and loading.headers["retry-after"]
        built.set()
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    finally:
        server.__exit__()


def test_an_engine_that_fails_to_build_stops_the_server() -> None:
    def broken_build(config: EngineConfig) -> InferenceEngine:
        raise ConfigError("model file /models/absent.gguf not found", param="model")

    server = RunningServer(mock_server_config(), engine_factory=broken_build)
    server.thread.start()
    server.thread.join(timeout=30)
    assert not server.thread.is_alive()
    assert "model file /models/absent.gguf not found" in server.server.failure


def test_a_failing_batch_answers_500_for_every_sample_and_the_server_goes_on() -> None:
    def build(config: EngineConfig) -> InferenceEngine:
        pm = create_plugin_manager(
            entry_points=False, load=[SERVER_PLUGIN, *config.plugins.load]
        )  # the reference components
        pm.register(FailingExecutorPlugin())
        return InferenceEngine(config, plugin_manager=pm)

    config = mock_server_config(executor={"name": "failing", "vocab_size": 128}, max_retry_attempts=1)
    with RunningServer(config, engine_factory=build) as server:
        url = server.url
        bad = httpx.post(f"{url}/v1/completions", json={"prompt": POISON, "max_tokens": 20, "n": 3}, timeout=30)
        assert bad.status_code == 500  # every one of the n=3 samples ended, none left waiting
        assert_internal_error(bad.json())
        events = stream_events(url, {"prompt": POISON, "max_tokens": 5})
        assert events[-1] == "[DONE]"
        assert_internal_error(events[-2])
        good = httpx.post(
            f"{url}/v1/completions", json={"prompt": "fine", "max_tokens": 20, "temperature": 0}, timeout=30
        )
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 20
        assert server.engine.get_memory_stats().used_blocks == 0


def test_a_faulty_step_fails_what_is_in_flight_then_the_engine_goes_out_of_service() -> None:
    config = mock_server_config()
    with RunningServer(config, engine_factory=StumblingEngine) as server:
        url = server.url
        body = {"prompt": "abc", "max_tokens": 5}
        server.engine.faults = 1
        failed = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert failed.status_code == 500 and "internal error (id " in failed.json()["error"]["message"]
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200  # one fault is survived
        assert httpx.get(f"{url}/readyz").status_code == 200

        server.engine.faults = 100
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 500
        server.thread.join(timeout=10)  # the aborted request's own steps keep failing: three in a row stop the server
        assert not server.thread.is_alive()
        assert "failed steps in a row" in server.server.failure


class OutOfServiceBackend:
    """A backend that failed, with a reason that names a path."""

    error = "the model failed to load: ConfigError: model file /srv/secret/weights.gguf not found"
    error_status = 500
    is_ready = False
    tokenizer = engine = None

    def engine_metrics(self) -> None:
        return None

    def start(self, loop: Any) -> None:
        pass

    def stop(self, drain_timeout: float) -> None:
        pass


def test_unauthenticated_endpoints_keep_the_reason_to_the_log() -> None:
    with TestClient(create_app(mock_server_config(), OutOfServiceBackend())) as client:
        for response in (
            client.get("/readyz"),
            client.get("/metrics"),
            client.post("/v1/completions", json={"prompt": "x"}),
        ):
            assert response.status_code in (200, 503)
            assert "/srv/secret" not in response.text and "ConfigError" not in response.text
        assert client.get("/readyz").json() == {"status": "not ready", "detail": "the backend is out of service"}


class LateFailingExecutor(MockExecutor):
    """The mock executor, except that a batch fails once a sequence in it has generated three tokens."""

    def execute(self, batch: Any) -> Any:
        if any(s.num_output_tokens >= 3 for s in batch.sequences):
            raise RuntimeError("injected executor fault")
        return super().execute(batch)


def test_a_response_that_fails_mid_stream_ends_with_an_error_and_response_failed() -> None:
    class Plugin:
        @hookimpl
        def register_executors(self, register) -> None:
            register("late-failing", LateFailingExecutor)

    def build(config: EngineConfig) -> InferenceEngine:
        pm = create_plugin_manager(entry_points=False, load=[SERVER_PLUGIN, *config.plugins.load])
        pm.register(Plugin())
        return InferenceEngine(config, plugin_manager=pm)

    config = mock_server_config(executor={"name": "late-failing", "vocab_size": 128}, max_retry_attempts=0)
    with RunningServer(config, engine_factory=build) as server:
        body = {"input": "abc", "max_output_tokens": 10, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=30) as response:
            assert response.status_code == 200
            events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    kinds = [event["type"] for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.output_text.delta" in kinds and kinds[-2:] == ["error", "response.failed"]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert_internal_error({"error": events[-2]})
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error" and failed["usage"] is None
