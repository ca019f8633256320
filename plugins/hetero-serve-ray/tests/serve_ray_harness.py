"""Test harness: mock-replica configs and a live server in front of replicas (imported by the tests of this folder)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import httpx
import uvicorn

from hetero_core.config import EngineConfig
from hetero_core.metrics import EngineMetrics
from hetero_core.sequence import FinishReason
from hetero_serve_openai.app import create_app
from hetero_serve_openai.backend import create_backend

OBJECT_STORE_BYTES = 128 * 2**20
NOT_NEEDED_BY_MOCK_REPLICAS = ["torch", "numba-cuda"]  # keeps torch out of the mock replicas' processes


def mock_config(**overrides: Any) -> EngineConfig:
    values: dict[str, Any] = dict(
        tokenizer="simple",
        executor={"name": "mock", "vocab_size": 128, "step_latency": 0.01},
        block_size=4,
        max_num_blocks=256,
        data_parallel_size=2,
        plugins={"disable": NOT_NEEDED_BY_MOCK_REPLICAS},
        server={"model_name": "mock", "backend_options": {"num_cpus_per_replica": 0.5, "health_check_interval": 0.2}},
    )
    values.update(overrides)
    return EngineConfig.from_mapping(values)


def num_completed(metrics: EngineMetrics) -> int:
    """Requests a replica finished normally (stop or length)."""
    return metrics.requests_finished[FinishReason.STOP] + metrics.requests_finished[FinishReason.LENGTH]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ReplicatedServer:
    """``create_app`` over the ``ray`` backend, served by uvicorn on a free loopback port in a thread."""

    def __init__(self, config: EngineConfig, *, ready_timeout: float = 120.0) -> None:
        port = free_port()
        self.ready_timeout = ready_timeout
        self.config = config.evolve(server={"host": "127.0.0.1", "port": port})
        self.backend = create_backend(self.config)
        self.app = create_app(self.config, self.backend)
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ReplicatedServer:
        self.thread.start()
        wait_until(lambda: self.all_ready(), "every replica is ready", timeout=self.ready_timeout)
        return self

    def all_ready(self) -> bool:
        try:
            httpx.get(f"{self.url}/healthz")
        except httpx.HTTPError:
            return False
        return len(self.backend.replicas) == self.config.data_parallel_size and all(
            r.is_ready for r in self.backend.replicas
        )

    def __exit__(self, *_exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


def wait_until(condition: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)
