"""One API call's generations: submit every prompt, merge their deltas, abort them all if the client leaves."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Mapping, Sequence

import attrs

from hetero_core.batch import TokenLogprobs
from hetero_core.outputs import StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason
from hetero_core.server.metrics import ServerMetrics

REQUEST_ENDING = (FinishReason.ABORT, FinishReason.ERROR)  # the engine ends every sample of the request with these

Input = tuple[str | Sequence[int] | None, Sequence[Mapping[str, Any]] | None]  # (prompt, messages)


@attrs.define
class Choice:
    """Everything one sample (one OpenAI choice) produced."""

    index: int
    text: str = ""
    token_ids: list[int] = attrs.field(factory=list)
    logprobs: list[TokenLogprobs] = attrs.field(factory=list)
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    error: str | None = None


class Generation:
    """Submits ``inputs`` (each with ``params.n`` samples) and yields ``(choice, delta)`` as steps produce them."""

    def __init__(self, backend: Any, metrics: ServerMetrics | None, inputs: list[Input], params: GenerationParams, request_id: str) -> None:
        self.backend = backend
        self.metrics = metrics
        self.inputs = inputs
        self.params = params
        self.request_id = request_id
        self.queue: asyncio.Queue[tuple[int, StreamDelta]] = asyncio.Queue()
        self.choices = [Choice(index=i) for i in range(len(inputs) * params.n)]
        self._submitted: list[str] = []
        self._started = time.monotonic()
        self._first_token_time: dict[int, float] = {}
        self._last_token_time: dict[int, float] = {}

    def _engine_id(self, number: int) -> str:
        return self.request_id if len(self.inputs) == 1 else f"{self.request_id}-{number}"

    def start(self) -> None:
        """Submit every input; if one is rejected, withdraw the others and re-raise."""
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

    @property
    def is_finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    async def deltas(self) -> AsyncIterator[tuple[Choice, StreamDelta]]:
        while not self.is_finished:
            number, delta = await self.queue.get()
            choice = self.choices[number * self.params.n + delta.index]
            if choice.finish_reason is not None:  # already closed with its request's abort or error
                continue
            choice.text += delta.text
            choice.token_ids.extend(delta.token_ids)
            choice.logprobs.extend(delta.logprobs or ())
            choice.num_prompt_tokens = delta.num_prompt_tokens
            choice.finish_reason = delta.finish_reason
            choice.error = delta.error
            self._observe(choice, delta)
            yield choice, delta
            if delta.finish_reason in REQUEST_ENDING:
                for sibling in self._end_siblings(number, delta):
                    yield sibling, StreamDelta(self.request_id, sibling.index, "", [], finish_reason=delta.finish_reason, error=delta.error)

    def _end_siblings(self, number: int, delta: StreamDelta) -> list[Choice]:
        """An abort or an error ends the whole engine request: close the samples that never got their own final delta."""
        siblings = self.choices[number * self.params.n : (number + 1) * self.params.n]
        open_siblings = [c for c in siblings if c.finish_reason is None]
        for sibling in open_siblings:
            sibling.finish_reason, sibling.error = delta.finish_reason, delta.error
            sibling.num_prompt_tokens = delta.num_prompt_tokens
        return open_siblings

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
        prompt_tokens = sum(self.choices[number * self.params.n].num_prompt_tokens for number in range(len(self.inputs)))
        completion_tokens = sum(len(c.token_ids) for c in self.choices)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
