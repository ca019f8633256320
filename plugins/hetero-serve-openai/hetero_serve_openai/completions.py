"""``/v1/completions`` and ``/v1/chat/completions``: one flow, two response formats.

Each call builds a :class:`Generation` on a worker thread, then either
waits for every choice (aborting them when the client disconnects) or
streams server-sent events that end with ``[DONE]``; a failure after the
200 went out becomes an error event before ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any, AsyncIterator, Callable, Iterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from hetero_core.errors import ValidationError
from hetero_serve_openai.errors import APIError, error_body, internal_error_body
from hetero_serve_openai.generation import Choice, Generation, Prepare
from hetero_serve_openai.inputs import chat_inputs, completion_inputs
from hetero_serve_openai.openai_format import SSE_DONE, ChatFormat, CompletionFormat, envelope, sse
from hetero_serve_openai.schemas import ChatCompletionRequest, CompletionRequest
from hetero_serve_openai.service import Service

DISCONNECT_POLL = 0.1  # seconds between checks that a non-streaming client is still there


def add_generation_routes(app: FastAPI, service: Service) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        backend = service.ready_backend(body.model)
        with naming_the_constraint(body.constraint_field):
            return await _generate(
                service, request, body, CompletionFormat, completion_inputs(body, backend, service.config), "cmpl"
            )

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        backend = service.ready_backend(body.model)
        field = (
            "tools" if body.tool_use.constraint is not None else body.constraint_field
        )  # a calls' grammar is built from the tools
        with naming_the_constraint(field):
            return await _generate(
                service, request, body, ChatFormat, chat_inputs(body, backend, service.config), "chatcmpl"
            )


@contextlib.contextmanager
def naming_the_constraint(field: str | None) -> Iterator[None]:
    """A constraint the grammar engine refuses at submission is a 400 naming the request field it came from."""
    try:
        yield
    except ValidationError as exc:
        if exc.param != "structured_output" or field is None:
            raise
        reason = exc.message.removeprefix("structured_output: ")
        if field == "tools":
            reason = f"a function's parameters schema cannot be used: {reason.split('cannot be used: ', 1)[-1]}"
        raise APIError(400, reason, param=field) from exc


async def _generate(
    service: Service, request: Request, body: Any, format_class: type, prepare: Prepare, id_prefix: str
) -> Any:
    request_id = f"{id_prefix}-{uuid.uuid4().hex}"
    created = int(time.time())
    generation = Generation(service.backend, service.metrics, request_id)
    await generation.start(prepare)
    shape = format_class(body, service.backend.tokenizer, generation)
    service.live.add(generation)
    if body.stream:
        return _stream(service, generation, _chunks(service, generation, shape, body.include_usage, created))
    try:
        choices = await wait_for_choices(generation, request)
    finally:
        service.live.discard(generation)
    raise_if_failed(choices)
    payload = [shape.whole(choice) for choice in choices]
    response = envelope(shape.response_object, request_id, created, service.model_name, payload, generation.usage())
    return response | shape.response_fields(choices)


async def _chunks(
    service: Service, generation: Generation, shape: Any, include_usage: bool, created: int
) -> AsyncIterator[str]:
    model, request_id = service.model_name, generation.request_id
    for opening in shape.opening():
        yield sse(envelope(shape.chunk_object, request_id, created, model, [opening]))
    async for choice, delta in generation.deltas():
        raise_if_failed([choice])
        payload = shape.chunk(choice, delta)
        if payload is not None:
            yield sse(envelope(shape.chunk_object, request_id, created, model, [payload]))
    if include_usage:
        yield sse(envelope(shape.chunk_object, request_id, created, model, [], generation.usage()))


def raise_if_failed(choices: list[Choice]) -> None:
    for choice in choices:
        if choice.failure is not None:
            raise choice.failure


async def wait_for_choices(generation: Generation, request: Request) -> list[Choice]:
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


def _stream(service: Service, generation: Generation, chunks: AsyncIterator[str]) -> StreamingResponse:
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

    return event_stream(service, generation, events())


def event_stream(service: Service, generation: Generation, events: AsyncIterator[str]) -> StreamingResponse:
    """``events`` as server-sent events of a live generation: however the stream ends,
    the generation leaves ``service.live``, aborted if unfinished."""

    def close() -> None:
        service.live.discard(generation)
        if not generation.is_finished:
            generation.abort()

    return _EventStream(events, close)


class _EventStream(StreamingResponse):
    """A stream that runs ``on_close`` however it ends, even when the client leaves before the first event."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
