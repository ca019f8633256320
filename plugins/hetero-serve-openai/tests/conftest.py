"""The server's tests: a real server on a loopback port, in a background thread, for real HTTP clients.

As in the core's tests, each module sees only the built-ins, the reference
components and this plugin, unless it is marked ``integration``: then every
installed plugin loads (the real-model tests, also marked ``model``).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Iterator

import httpx
import pytest

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.testing.plugin_isolation import installed_plugins, isolate_plugins
from hetero_serve_openai.app import create_app
from hetero_serve_openai.async_engine import AsyncEngine
from hetero_serve_openai.run import Server

PLUGIN = "serve-openai"
SERVER_PLUGIN = "hetero_serve_openai.plugin"  # the module, for plugin managers built without entry points


without_other_plugins, installed_plugins_for_integration_tests = isolate_plugins(PLUGIN)


class RunningServer:
    """``create_app`` served by uvicorn on a free loopback port; ``engine_factory`` replaces how the engine is built."""

    def __init__(
        self, config: EngineConfig, *, engine_factory: Callable[[EngineConfig], InferenceEngine] | None = None
    ) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.config = config.evolve(server={"host": "127.0.0.1", "port": port})
        backend = None if engine_factory is None else AsyncEngine(self.config, engine_factory=engine_factory)
        self.app = create_app(self.config, backend)
        self.url = f"http://127.0.0.1:{port}"
        self.server = Server(self.app, self.config, log_level="error")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def engine(self):
        return self.app.state.backend.engine

    def __enter__(self) -> RunningServer:
        return self.start()

    def start(self, *, until: str = "/readyz") -> RunningServer:
        """Serve, and return once ``until`` answers 200 (``/healthz`` to return before the engine is built)."""
        self.thread.start()
        deadline = time.monotonic() + 300  # a loaded machine may take minutes to load and warm the real model
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}{until}").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the server did not answer {until}")

    def __exit__(self, *_exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def mock_server_config(**overrides: Any) -> EngineConfig:
    """A server on the core's reference components (see ``tests/conftest.py``)."""
    values: dict[str, Any] = dict(
        tokenizer="simple",
        executor={"name": "mock", "vocab_size": 128},
        scheduler="reference",
        cache_allocator="reference",
        plugins={"load": ["hetero_core.testing.reference"]},
        block_size=4,
        max_num_blocks=256,
    )
    values.update(overrides)
    return EngineConfig.from_mapping(values)


@pytest.fixture(scope="session")
def model_server() -> Iterator[RunningServer]:
    """The embedded SmolLM2 in float32 (deterministic greedy answers), loaded once for every module."""
    config = EngineConfig(
        executor={"name": "torch", "dtype": "float32"}, max_model_len=1024, server={"model_name": "smollm2"}
    )
    with installed_plugins():  # its tests are integration tests; a core module may be the first to ask for it
        server = RunningServer(config).start()
    try:
        yield server
    finally:
        server.__exit__()


@pytest.fixture(scope="module")
def mock_server() -> Iterator[RunningServer]:
    config = mock_server_config(
        executor={"name": "mock", "vocab_size": 128, "step_latency": 0.003}, server={"model_name": "mock"}
    )
    with RunningServer(config) as server:
        yield server
