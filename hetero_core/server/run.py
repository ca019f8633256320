"""``hetero-infer serve``: uvicorn in front of the app; SIGTERM drains in-flight requests, then exits."""

from __future__ import annotations

import structlog
import uvicorn

from hetero_core.config import EngineConfig
from hetero_core.server.app import create_app

log = structlog.get_logger()


def serve(config: EngineConfig) -> None:
    """Serve until SIGINT/SIGTERM; uvicorn stops accepting, then the app drains the engine (bounded)."""
    app = create_app(config)
    log.info("serving", host=config.server.host, port=config.server.port, backend=config.server.backend)
    uvicorn.run(
        app,
        host=config.server.host,
        port=config.server.port,
        log_level="warning",
        timeout_graceful_shutdown=int(config.server.drain_timeout) or None,
    )
