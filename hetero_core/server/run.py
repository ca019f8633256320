"""``hetero-infer serve``: uvicorn in front of the app; SIGTERM drains in-flight requests, then exits 0."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
from typing import Iterator

import structlog
import uvicorn

from hetero_core.config import EngineConfig
from hetero_core.server.app import API_KEY_ENV, create_app
from hetero_core.server.backend import backend_name

log = structlog.get_logger()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


class DrainingServer(uvicorn.Server):
    """On SIGINT/SIGTERM: stop accepting, let running requests finish, exit normally (no re-raised signal)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(config: EngineConfig) -> None:
    """Serve until SIGINT/SIGTERM; in-flight requests then get up to ``server.drain_timeout`` seconds."""
    app = create_app(config)
    log.info("serving", host=config.server.host, port=config.server.port, backend=backend_name(config))
    if not is_loopback(config.server.host) and not (config.server.api_key or os.environ.get(API_KEY_ENV)):
        log.warning("serving beyond this machine without an API key: anyone who can reach it may use it", host=config.server.host)
    uvicorn_config = uvicorn.Config(
        app,
        host=config.server.host,
        port=config.server.port,
        log_level="warning",
        timeout_graceful_shutdown=max(1, int(config.server.drain_timeout)),
    )
    DrainingServer(uvicorn_config).run()
    log.info("server stopped")
