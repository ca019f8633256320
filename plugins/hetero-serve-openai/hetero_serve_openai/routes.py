"""The endpoints that generate nothing: health, readiness, metrics, the model list, tokenize and detokenize.

``/healthz`` and ``/readyz`` are unauthenticated, so they say only
whether the server is alive and ready; why a backend is not ready is in
the log, never on these endpoints.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hetero_serve_openai.errors import APIError
from hetero_serve_openai.inputs import render_chat
from hetero_serve_openai.schemas import DetokenizeRequest, TokenizeRequest
from hetero_serve_openai.service import Service


def add_routes(app: FastAPI, service: Service) -> None:
    add_probe_routes(app, service)
    add_model_routes(app, service)
    add_token_routes(app, service)


def add_probe_routes(app: FastAPI, service: Service) -> None:
    """Liveness, readiness and Prometheus metrics."""

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        backend = service.backend
        if backend.is_ready:
            return JSONResponse({"status": "ready"})
        detail = "the model is loading" if backend.error is None else "the backend is out of service"
        return JSONResponse({"status": "not ready", "detail": detail}, status_code=503)

    for path, probe in (("/healthz", healthz), ("/readyz", readyz)):  # load balancers probe with HEAD too
        app.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def add_model_routes(app: FastAPI, service: Service) -> None:
    """OpenAI's model list and model card."""

    def model_card() -> dict[str, Any]:
        card: dict[str, Any] = {
            "id": service.model_name,
            "object": "model",
            "created": service.started,
            "owned_by": "hetero-infer",
        }
        if service.backend.max_model_len is not None:
            card["max_model_len"] = service.backend.max_model_len
        return card

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != service.model_name:
            raise APIError(
                404,
                f"model {model_id!r} does not exist; this server serves {service.model_name!r}",
                param="model",
                code="model_not_found",
            )
        return model_card()


def add_token_routes(app: FastAPI, service: Service) -> None:
    """Text or a chat to token ids, and token ids to text, with the served model's tokenizer."""

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        tokenizer = _tokenizer(service.ready_backend(body.model))
        if body.messages is None and body.prompt is None:
            raise APIError(400, "give 'prompt' or 'messages'", param="prompt")
        if body.messages is not None and body.prompt is not None:
            raise APIError(400, "give 'prompt' or 'messages', not both", param="messages")
        tokens = await asyncio.to_thread(_encode, tokenizer, body)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": service.backend.max_model_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        tokenizer = _tokenizer(service.ready_backend(body.model))
        bad = [t for t in body.tokens if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise APIError(400, f"token ids must be in [0, {tokenizer.vocab_size}), got {bad[0]}", param="tokens")
        text = await asyncio.to_thread(tokenizer.decode, body.tokens, skip_special_tokens=False)
        return {"prompt": text}


def _encode(tokenizer: Any, body: TokenizeRequest) -> list[int]:
    """The body's prompt, or its messages rendered with the chat template, as token ids (on a worker thread)."""
    if body.messages is None:
        return tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    messages = [m.to_template() for m in body.messages]
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools or ()]
    return tokenizer.encode(render_chat(tokenizer, messages, body, tools), add_special_tokens=False)


def _tokenizer(backend: Any) -> Any:
    if backend.tokenizer is None:
        raise APIError(400, "this backend has no tokenizer")
    return backend.tokenizer
