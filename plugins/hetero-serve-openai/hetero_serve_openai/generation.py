"""One API call's generations: submit every prompt, merge their deltas, abort them all if the client leaves.

Submission runs on a worker thread (tokenizing a multi-megabyte prompt or
rendering a chat template must not stall the event loop), and each delta
costs O(1) however many choices the call has.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

import attrs
import structlog

from hetero_core.batch import TokenLogprobs
from hetero_core.outputs import StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason
from hetero_core.serving import ServingBackend
from hetero_serve_openai.errors import APIError
from hetero_serve_openai.metrics import ServerMetrics

log = structlog.get_logger()

Input = tuple[str | Sequence[int] | None, Sequence[Mapping[str, Any]] | None]  # (prompt, messages)
Prepare = Callable[[], tuple[list[Input], GenerationParams]]  # runs on the worker thread
_CUT = object()  # queued by Generation.end: close every open choice


@attrs.define
class Choice:
    """Everything one sample (one OpenAI choice) produced."""

    index: int
    text: str = ""
    token_ids: list[int] = attrs.field(factory=list)
    logprobs: list[TokenLogprobs] = attrs.field(factory=list)
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    failure: APIError | None = None  # what the client is told when the sample failed
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # its input's, shared by the input's choices


class Generation:
    """Submits one call's inputs (each with ``params.n`` samples) and yields ``(choice, delta)``
    as steps produce them."""

    def __init__(self, backend: ServingBackend, metrics: ServerMetrics | None, request_id: str) -> None:
        self.backend = backend
        self.metrics = metrics
        self.request_id = request_id
        self.inputs: list[Input] = []
        self.params = GenerationParams()
        self.choices: list[Choice] = []
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self._num_open = 0
        self._submitted: list[str] = []
        self._failures: dict[int, APIError] = {}
        self._cut: APIError | None = None
        self._started = time.monotonic()
        self._first_token_time: dict[int, float] = {}
        self._last_token_time: dict[int, float] = {}

    def _engine_id(self, number: int) -> str:
        return self.request_id if len(self.inputs) == 1 else f"{self.request_id}-{number}"

    async def start(self, prepare: Prepare) -> None:
        """Run ``prepare`` and submit what it returns, on a worker thread;
        a rejection withdraws the rest and re-raises."""
        submitting = asyncio.ensure_future(asyncio.to_thread(self._submit_all, prepare))
        try:
            await asyncio.shield(submitting)
        except asyncio.CancelledError:  # the client left: withdraw whatever the thread still submits
            submitting.add_done_callback(lambda _task: self.abort())
            raise

    def _submit_all(self, prepare: Prepare) -> None:
        self.inputs, self.params = prepare()
        self.choices = [Choice(index=i) for i in range(len(self.inputs) * self.params.n)]
        self._num_open = len(self.choices)
        try:
            for number, (prompt, messages) in enumerate(self.inputs):
                self.backend.submit(prompt, messages, self.params, self._engine_id(number), self.queue, number)
                self._submitted.append(self._engine_id(number))
        except Exception:
            self.abort()
            raise

    def abort(self) -> None:
        for engine_id in self._submitted:
            self.backend.abort(engine_id)

    def end(self, failure: APIError) -> None:
        """Stop now: abort every input and fail each open choice with ``failure`` (the server is shutting down)."""
        self._cut = failure
        self.queue.put_nowait(_CUT)  # ahead of the abort's own final deltas, which a backend may queue at once
        self.abort()

    @property
    def is_finished(self) -> bool:
        return self._num_open == 0

    async def deltas(self) -> AsyncIterator[tuple[Choice, StreamDelta]]:
        while not self.is_finished:
            item = await self.queue.get()
            if item is _CUT:
                for choice in [c for c in self.choices if c.finish_reason is None]:
                    self._close(choice, FinishReason.ERROR, self._cut)
                    yield choice, StreamDelta(self.request_id, choice.index, "", [], finish_reason=FinishReason.ERROR)
                return
            number, delta = item
            if delta.prompt_logprobs is not None:  # the input's first delta: every sample of it was given this prompt
                for sibling in self.choices[number * self.params.n : (number + 1) * self.params.n]:
                    sibling.prompt_logprobs = delta.prompt_logprobs
            choice = self.choices[number * self.params.n + delta.index]
            if choice.finish_reason is not None:  # a second final delta from a faulty backend changes nothing
                continue
            choice.text += delta.text
            choice.token_ids.extend(delta.token_ids)
            choice.logprobs.extend(delta.logprobs or ())
            choice.num_prompt_tokens = delta.num_prompt_tokens
            if delta.finish_reason is not None:
                failure = self._failure(number, delta.error) if delta.finish_reason is FinishReason.ERROR else None
                self._close(choice, delta.finish_reason, failure)
            self._observe(choice, delta)
            yield choice, delta

    def _close(self, choice: Choice, reason: FinishReason, failure: APIError | None) -> None:
        choice.finish_reason, choice.failure = reason, failure
        self._num_open -= 1

    def _failure(self, number: int, error: str | None) -> APIError:
        """What the client hears of a failed input: a 500 names only a logged id, never the internal error text."""
        if number not in self._failures:
            status = self.backend.error_status
            if status == 500:
                error_id = uuid.uuid4().hex[:12]
                log.error("generation failed", request_id=self._engine_id(number), error_id=error_id, error=error)
                self._failures[number] = APIError(500, f"internal error (id {error_id})", code="internal_error")
            else:  # the backend's own reason (a bridge program's exit status or timeout), composed by the server
                self._failures[number] = APIError(status, f"generation failed: {error}", code="generation_failed")
        return self._failures[number]

    async def wait(self) -> list[Choice]:
        async for _ in self.deltas():
            pass
        return self.choices

    def _observe(self, choice: Choice, delta: StreamDelta) -> None:
        """Latency histograms, as tokens reach the client (vLLM's definitions)."""
        if self.metrics is None:
            return
        now = time.monotonic()
        if delta.token_ids:
            previous = self._last_token_time.get(choice.index)
            if previous is None:
                self.metrics.time_to_first_token.observe(now - self._started)
                self._first_token_time[choice.index] = now
            else:
                self.metrics.observe_inter_token_latency(now - previous)
            self._last_token_time[choice.index] = now
        if delta.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.metrics.e2e_latency.observe(now - self._started)
            first = self._first_token_time.get(choice.index)
            if len(choice.token_ids) > 1 and first is not None:
                last = self._last_token_time[choice.index]
                self.metrics.request_time_per_output_token.observe((last - first) / (len(choice.token_ids) - 1))

    def usage(self) -> dict[str, int]:
        prompt_tokens = sum(
            self.choices[number * self.params.n].num_prompt_tokens for number in range(len(self.inputs))
        )
        completion_tokens = sum(len(c.token_ids) for c in self.choices)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
