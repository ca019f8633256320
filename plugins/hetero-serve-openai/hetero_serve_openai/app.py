"""The OpenAI-compatible HTTP API over one serving backend (see :mod:`.backend`).

Middleware runs in this order on every request: the API key (before the
body is read), then the body's size and read-time limits; only then does
FastAPI parse the body. Endpoints live in :mod:`.routes`,
:mod:`.completions` and :mod:`.responses`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from fastapi import FastAPI

from hetero_core.config import EngineConfig
from hetero_core.errors import EngineError
from hetero_core.model_source import resolve_model_path
from hetero_core.serving import ServingBackend
from hetero_serve_openai.auth import APIKeyCheck, api_key
from hetero_serve_openai.backend import backend_name, create_backend
from hetero_serve_openai.capabilities import capabilities_of
from hetero_serve_openai.completions import add_generation_routes
from hetero_serve_openai.config import server_config
from hetero_serve_openai.connections import log_resource_exhaustion_once
from hetero_serve_openai.errors import install_error_handlers
from hetero_serve_openai.limits import BodyLimits
from hetero_serve_openai.metrics import ServerMetrics
from hetero_serve_openai.responses import add_responses_routes
from hetero_serve_openai.routes import add_routes
from hetero_serve_openai.service import Service


def served_model_name(config: EngineConfig) -> str:
    server = server_config(config)
    if server.model_name:
        return server.model_name
    if server.backend == "command_bridge":
        return "command-bridge"
    try:
        return resolve_model_path(config.model).stem
    except EngineError:
        return config.model or "default"


def create_app(config: EngineConfig, backend: ServingBackend | None = None) -> FastAPI:
    """The ASGI app; ``backend`` defaults to the one the config names (see :func:`create_backend`)."""
    server = server_config(config)  # a bad server key fails here, at start-up
    key = api_key(server)  # so does a key no client could send
    backend = create_backend(config) if backend is None else backend
    capabilities_of(backend, backend_name(config))  # a misspelt capability fails at start-up, not on a request
    model_name = served_model_name(config)
    service = Service(config, backend, model_name, ServerMetrics(model_name, backend.engine_metrics))

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(log_resource_exhaustion_once())
        backend.start(loop)
        yield
        await asyncio.to_thread(backend.stop, server.drain_timeout)

    app = FastAPI(title="hetero-infer", version="0.1.0", lifespan=lifespan)
    app.state.backend = backend
    app.state.service = service
    app.add_middleware(BodyLimits, max_bytes=server.max_body_bytes, read_timeout=server.read_timeout)
    if key is not None:
        app.add_middleware(APIKeyCheck, key=key, protect_metrics_and_docs=server.protect_metrics_and_docs)
    install_error_handlers(app)
    add_routes(app, service)
    add_generation_routes(app, service)
    add_responses_routes(app, service)
    return app
