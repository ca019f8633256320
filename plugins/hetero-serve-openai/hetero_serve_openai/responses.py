"""``POST /v1/responses``: OpenAI's Responses API, on the chat route's generation path.

The body becomes a chat completion (:meth:`ResponsesRequest.to_chat`), whose
inputs are prepared by :func:`~hetero_serve_openai.inputs.chat_inputs` and
generated as one :class:`Generation`; errors that name a chat field are
renamed for this endpoint (``max_completion_tokens`` is ``max_output_tokens``).
The text becomes output items (:mod:`.responses_output`). Streamed, the
events are server-sent with their ``event:`` name and a ``sequence_number``
counting from 0: ``response.created``, ``response.in_progress``, the items'
events, then ``response.completed`` (``response.incomplete`` when
``max_output_tokens`` cut it). A failure after the 200 went out is an
``error`` event and then ``response.failed``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import time
from typing import Any, AsyncIterator, Iterator

import attrs
from fastapi import FastAPI, Request

from hetero_core.errors import EngineError
from hetero_core.sequence import FinishReason
from hetero_serve_openai.completions import event_stream, naming_the_constraint, raise_if_failed, wait_for_choices
from hetero_serve_openai.errors import APIError, internal_error_body
from hetero_serve_openai.generation import Choice, Generation
from hetero_serve_openai.inputs import chat_inputs
from hetero_serve_openai.responses_output import OutputItems, item_id
from hetero_serve_openai.responses_request import CHAT_TO_RESPONSES, ResponsesRequest
from hetero_serve_openai.service import Service


def add_responses_routes(app: FastAPI, service: Service) -> None:
    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request) -> Any:
        response = ResponseObject(body, item_id("resp"), int(time.time()), service.model_name)
        with _responses_field_names():
            chat = body.to_chat()
            backend = service.ready_backend(chat.model)
            plan = chat.tool_use
            constraint_field = (
                "tools" if plan.constraint is not None else "text.format" if chat.constraint_field is not None else None
            )
            with naming_the_constraint(constraint_field):
                generation = Generation(backend, service.metrics, response.id)
                await generation.start(chat_inputs(chat, backend, service.config))
        items = OutputItems(plan)
        service.live.add(generation)
        if body.stream:
            return event_stream(service, generation, _events(generation, response, items))
        try:
            choices = await wait_for_choices(generation, request)
        finally:
            service.live.discard(generation)
        raise_if_failed(choices)
        status = _status(choices[0])
        items.feed(choices[0].text, is_last=True)
        items.finish(status)
        return response.body(status, items.items, _usage(generation))


@attrs.frozen
class ResponseObject:
    """OpenAI's ``response`` object for one request: what it asked for, with its status, output and usage."""

    request: ResponsesRequest
    id: str
    created_at: int
    model: str

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        request = self.request
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "metadata": request.metadata or {},
            "model": self.model,
            "output": output,
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": None,
            "store": False,
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "text": {"format": {"type": "text"}} if request.text is None else request.text.echoed(),
            "tool_choice": request.echoed_tool_choice(),
            "tools": [tool.echoed() for tool in request.tools or ()],
            "top_p": 1.0 if request.top_p is None else request.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": request.user,
        }
        if status == "completed":
            body["completed_at"] = int(time.time())
        return body


def _status(choice: Choice) -> str:
    return "incomplete" if choice.finish_reason is FinishReason.LENGTH else "completed"


def _usage(generation: Generation) -> dict[str, Any]:
    """OpenAI's usage object; the prefix cache's hits are not counted per request, so ``cached_tokens`` is 0."""
    usage = generation.usage()
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


async def _events(generation: Generation, response: ResponseObject, items: OutputItems) -> AsyncIterator[str]:
    numbers = itertools.count()

    def event(payload: dict[str, Any]) -> str:
        data = json.dumps(payload | {"sequence_number": next(numbers)}, ensure_ascii=False, allow_nan=False)
        return f"event: {payload['type']}\ndata: {data}\n\n"

    opening = response.body("in_progress", [], None)
    yield event({"type": "response.created", "response": opening})
    yield event({"type": "response.in_progress", "response": opening})
    try:
        async for choice, delta in generation.deltas():
            raise_if_failed([choice])
            for payload in items.feed(delta.text, is_last=delta.finish_reason is not None):
                yield event(payload)
        status = _status(generation.choices[0])
        for payload in items.finish(status):
            yield event(payload)
        final = "response.completed" if status == "completed" else "response.incomplete"
        yield event({"type": final, "response": response.body(status, items.items, _usage(generation))})
    except Exception as exc:  # after the 200 went out: the client is told in events
        failure = (
            exc
            if isinstance(exc, APIError)
            else APIError(500, internal_error_body(exc)["error"]["message"], code="internal_error")
        )
        yield event(
            {
                "type": "error",
                "code": failure.code or "server_error",
                "message": failure.message,
                "param": failure.param,
            }
        )
        error = {"code": "server_error", "message": failure.message}
        yield event({"type": "response.failed", "response": response.body("failed", items.items, None, error)})


@contextlib.contextmanager
def _responses_field_names() -> Iterator[None]:
    """An error naming a chat field names the Responses field it came from."""
    try:
        yield
    except APIError as exc:
        field = CHAT_TO_RESPONSES.get(exc.param or "", exc.param)
        raise APIError(exc.status, _renamed(exc.message), param=field, code=exc.code, headers=exc.headers) from exc
    except EngineError as exc:
        field = CHAT_TO_RESPONSES.get(exc.param or "", exc.param)
        raise type(exc)(_renamed(exc.message), param=field) from exc


def _renamed(message: str) -> str:
    """``message`` with every chat field it names replaced by its Responses field."""
    return _CHAT_NAMES.sub(lambda name: CHAT_TO_RESPONSES[name.group()], message)


_CHAT_NAMES = re.compile(rf"\b({'|'.join(map(re.escape, CHAT_TO_RESPONSES))})\b")
