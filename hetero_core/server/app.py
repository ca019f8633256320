"""The OpenAI-compatible HTTP API over one backend (the local engine or the command bridge)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import uuid
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hetero_core.config import EngineConfig
from hetero_core.errors import EngineError
from hetero_core.model_source import resolve_model_path
from hetero_core.server.backend import ServingBackend, create_backend
from hetero_core.server.errors import APIError, error_body, install_error_handlers, internal_error_body
from hetero_core.server.generation import Choice, Generation, Input
from hetero_core.server.limits import BodySizeLimit
from hetero_core.server.metrics import ServerMetrics
from hetero_core.server.openai_format import SSE_DONE, chat_logprobs, completion_logprobs, envelope, finish_reason, sse
from hetero_core.server.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

API_KEY_ENV = "HETERO_API_KEY"  # the API key when the config names none
DISCONNECT_POLL = 0.1  # seconds between checks that a non-streaming client is still there


def served_model_name(config: EngineConfig) -> str:
    if config.server.model_name:
        return config.server.model_name
    if config.server.backend == "command_bridge":
        return "command-bridge"
    try:
        return resolve_model_path(config.model).stem
    except EngineError:
        return config.model or "default"


def create_app(config: EngineConfig, backend: ServingBackend | None = None) -> FastAPI:
    """The ASGI app; ``backend`` defaults to the one the config names (see :func:`create_backend`)."""
    if backend is None:
        backend = create_backend(config)
    model_name = served_model_name(config)
    metrics = ServerMetrics(model_name, backend.engine_metrics)
    api_key = config.server.api_key or os.environ.get(API_KEY_ENV)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        backend.start(asyncio.get_running_loop())
        yield
        await asyncio.to_thread(backend.stop, config.server.drain_timeout)

    app = FastAPI(title="hetero-infer", version="0.1.0", lifespan=lifespan)
    app.state.backend = backend
    app.add_middleware(BodySizeLimit, max_bytes=config.server.max_body_bytes)
    install_error_handlers(app)

    async def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise APIError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')", code="invalid_api_key")

    def ready_backend(requested_model: str | None) -> Any:
        if requested_model is not None and requested_model != model_name:
            raise APIError(404, f"the model {requested_model!r} does not exist; this server serves {model_name!r}", param="model", code="model_not_found")
        if backend.error is not None:
            raise APIError(503, f"the engine is unavailable: {backend.error}")
        if not backend.is_ready:
            raise APIError(503, "the model is still loading", headers={"Retry-After": "5"})
        return backend

    # ------------------------------------------------------------------ health and metadata

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if backend.is_ready:
            return JSONResponse({"status": "ready"})
        message = backend.error or "the model is loading"
        return JSONResponse({"status": "not ready", "detail": message}, status_code=503)

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "hetero-infer"}]}

    @app.post("/tokenize", dependencies=[Depends(authorize)])
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        tokenizer = _tokenizer(ready_backend(body.model))
        if body.messages is not None:
            text = tokenizer.apply_chat_template([{"role": m.role, "content": m.text()} for m in body.messages])
            tokens = tokenizer.encode(text, add_special_tokens=False)
        elif body.prompt is not None:
            tokens = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        else:
            raise APIError(400, "give 'prompt' or 'messages'", param="prompt")
        return {"tokens": tokens, "count": len(tokens), "max_model_len": backend.max_model_len}

    @app.post("/detokenize", dependencies=[Depends(authorize)])
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        tokenizer = _tokenizer(ready_backend(body.model))
        bad = [t for t in body.tokens if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise APIError(400, f"token ids must be in [0, {tokenizer.vocab_size}), got {bad[0]}", param="tokens")
        return {"prompt": tokenizer.decode(body.tokens, skip_special_tokens=False)}

    # ------------------------------------------------------------------ generation

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, request: Request) -> Any:
        ready_backend(body.model)
        inputs = _prompts(body.prompt)
        params = body.params(16 if body.max_tokens is None else body.max_tokens, body.logprobs)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        generation = Generation(backend, metrics, inputs, params, request_id)
        generation.start()
        tokenizer = backend.tokenizer

        def prefix(choice: Choice) -> str:
            if not body.echo:
                return ""
            prompt = inputs[choice.index // params.n][0]
            return prompt if isinstance(prompt, str) else tokenizer.decode(prompt, skip_special_tokens=False)

        def logprobs(choice: Choice, entries: list, offset: int) -> dict | None:
            return None if body.logprobs is None else completion_logprobs(tokenizer, entries, offset)

        if body.stream:
            async def chunks() -> AsyncIterator[str]:
                sent_prefix: set[int] = set()
                async for choice, delta in generation.deltas():
                    _raise_if_failed(choice, backend)
                    text = delta.text
                    if choice.index not in sent_prefix:
                        sent_prefix.add(choice.index)
                        text = prefix(choice) + text
                    if not text and not delta.finish_reason and not delta.token_ids:
                        continue
                    offset = len(choice.text) - len(delta.text)
                    payload = {"index": choice.index, "text": text, "logprobs": logprobs(choice, delta.logprobs or [], offset), "finish_reason": finish_reason(choice)}
                    yield sse(envelope("text_completion", request_id, model_name, [payload]))
                if body.include_usage:
                    yield sse(envelope("text_completion", request_id, model_name, [], generation.usage()))

            return _stream(generation, chunks())

        choices = await _wait(generation, request)
        for choice in choices:
            _raise_if_failed(choice, backend)
        payload = [
            {"index": c.index, "text": prefix(c) + c.text, "logprobs": logprobs(c, c.logprobs, len(prefix(c))), "finish_reason": finish_reason(c)}
            for c in choices
        ]
        return envelope("text_completion", request_id, model_name, payload, generation.usage())

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        ready_backend(body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        max_tokens = body.max_completion_tokens or body.max_tokens
        if max_tokens is None:
            max_tokens = max(1, min(1024, _context_left(backend, messages)))
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
        params = body.params(max_tokens, (body.top_logprobs or 0) if body.logprobs else None)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        generation = Generation(backend, metrics, [(None, messages)], params, request_id)
        generation.start()
        tokenizer = backend.tokenizer

        def logprobs(entries: list) -> dict | None:
            return chat_logprobs(tokenizer, entries) if body.logprobs else None

        if body.stream:
            async def chunks() -> AsyncIterator[str]:
                for index in range(params.n):
                    first = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                    yield sse(envelope("chat.completion.chunk", request_id, model_name, [first]))
                async for choice, delta in generation.deltas():
                    _raise_if_failed(choice, backend)
                    if not delta.text and not delta.finish_reason and not delta.token_ids:
                        continue
                    payload = {
                        "index": choice.index,
                        "delta": {"content": delta.text} if delta.text else {},
                        "logprobs": logprobs(delta.logprobs or []),
                        "finish_reason": finish_reason(choice),
                    }
                    yield sse(envelope("chat.completion.chunk", request_id, model_name, [payload]))
                if body.include_usage:
                    yield sse(envelope("chat.completion.chunk", request_id, model_name, [], generation.usage()))

            return _stream(generation, chunks())

        choices = await _wait(generation, request)
        for choice in choices:
            _raise_if_failed(choice, backend)
        payload = [
            {"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": logprobs(c.logprobs), "finish_reason": finish_reason(c)}
            for c in choices
        ]
        return envelope("chat.completion", request_id, model_name, payload, generation.usage())

    return app


def _tokenizer(backend: Any) -> Any:
    if backend.tokenizer is None:
        raise APIError(400, "this backend has no tokenizer")
    return backend.tokenizer


def _prompts(prompt: Any) -> list[Input]:
    """OpenAI's prompt forms: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        return [(prompt, None)]
    if not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [(prompt, None)]
    return [(p, None) for p in prompt]


def _context_left(backend: Any, messages: list[dict]) -> int:
    if backend.tokenizer is None or backend.max_model_len is None:
        return 1024
    text = backend.tokenizer.apply_chat_template(messages)
    return backend.max_model_len - len(backend.tokenizer.encode(text, add_special_tokens=False))


def _raise_if_failed(choice: Choice, backend: Any) -> None:
    if choice.error is not None:
        raise APIError(backend.error_status, f"generation failed: {choice.error}", code="generation_failed")


async def _wait(generation: Generation, request: Request) -> list[Choice]:
    """Wait for every choice; abort the generations as soon as the client disconnects."""
    waiting = asyncio.ensure_future(generation.wait())
    try:
        while not waiting.done():
            await asyncio.wait({waiting}, timeout=DISCONNECT_POLL)
            if not waiting.done() and await request.is_disconnected():
                generation.abort()
                waiting.cancel()
                raise APIError(499, "client disconnected")
        return waiting.result()
    finally:
        if not waiting.done():
            waiting.cancel()
            generation.abort()


def _stream(generation: Generation, chunks: AsyncIterator[str]) -> StreamingResponse:
    """Server-sent events; ends with [DONE]; a failure becomes an error event; a departed client aborts."""

    async def events() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield chunk
            yield SSE_DONE
        except APIError as exc:
            yield sse(error_body(exc.status, exc.message, exc.param, exc.code))
            yield SSE_DONE
        except Exception as exc:  # a fault after the 200 went out: the client still gets an error event
            yield sse(internal_error_body(exc))
            yield SSE_DONE
        finally:
            if not generation.is_finished:
                generation.abort()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
