"""``hetero-infer serve``: uvicorn in front of the app.

SIGTERM (or SIGINT) stops accepting connections and lets in-flight requests
finish for up to ``server.drain_timeout`` seconds; what is still running
then is ended with an error (an error event on a stream), and the process
exits 0. A backend that fails (a model that cannot load, an engine out of
service) stops the server, and ``serve`` raises with the reason, so the
command exits non-zero instead of answering 503 forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import signal
import threading
from typing import Any, Iterator

import structlog
import uvicorn
from fastapi import FastAPI

from hetero_core.config import EngineConfig
from hetero_core.errors import EngineError
from hetero_serve_openai.app import create_app
from hetero_serve_openai.auth import api_key
from hetero_serve_openai.backend import backend_name
from hetero_serve_openai.config import server_config
from hetero_serve_openai.connections import bounded_protocol, fit_to_file_limit
from hetero_serve_openai.errors import APIError

log = structlog.get_logger()

SHUTDOWN_GRACE = 5.0  # seconds after the drain timeout for the ended requests to send their last bytes


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


class Server(uvicorn.Server):
    """uvicorn, with the drain described above; ``failure`` holds why a failed backend stopped it."""

    def __init__(self, app: FastAPI, config: EngineConfig, **uvicorn_options: Any) -> None:
        server = server_config(config)
        max_connections, backlog = fit_to_file_limit(server.max_connections)
        super().__init__(
            uvicorn.Config(
                app,
                host=server.host,
                port=server.port,
                backlog=backlog,
                http=bounded_protocol(max_connections, server.read_timeout),
                timeout_graceful_shutdown=server.drain_timeout + SHUTDOWN_GRACE,  # type: ignore[arg-type]
                **uvicorn_options,
            )
        )
        self.app = app
        self.drain_timeout = server.drain_timeout
        self.failure: str | None = None

    async def on_tick(self, counter: int) -> bool:
        error = self.app.state.backend.error
        if error is not None and self.failure is None:
            self.failure = error
            log.error("the backend failed: stopping the server", error=error)
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: Any = None) -> None:
        cut = asyncio.get_running_loop().call_later(self.drain_timeout, self._end_in_flight)
        try:
            await super().shutdown(sockets)
        finally:
            cut.cancel()

    def _end_in_flight(self) -> None:
        failure = APIError(503, "the server shut down before this request finished", headers={"Retry-After": "5"})
        ended = self.app.state.service.end_all(failure)
        if ended:
            log.warning("drain timeout passed: ended requests in flight", count=ended, drain_timeout=self.drain_timeout)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """On SIGINT/SIGTERM: drain and return normally (uvicorn would re-raise the signal); only on the main thread."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(config: EngineConfig) -> None:
    """Serve until SIGINT/SIGTERM; raise ``EngineError`` if the backend fails."""
    app = create_app(config)
    server = server_config(config)
    log.info("serving", host=server.host, port=server.port, backend=backend_name(config))
    if not is_loopback(server.host) and api_key(server) is None:
        log.warning(
            "serving beyond this machine without an API key: anyone who can reach it may use it", host=server.host
        )
    server = Server(app, config, log_level="warning")
    server.run()
    if server.failure is not None:
        raise EngineError(f"the server stopped: {server.failure}")
    log.info("server stopped")
