"""Any serving backend from synchronous code: ``generate`` a batch, ``stream`` one prompt.

The backend runs on a private event loop on a background thread, exactly as
it would behind the HTTP server; results come back in input order.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Mapping, Sequence

from hetero_core.errors import EngineError, ValidationError
from hetero_core.outputs import StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.serving import ServingBackend
from hetero_serve_openai.capabilities import capabilities_of, unhonoured
from hetero_serve_openai.generation import Choice, Generation, Input

READY_POLL = 0.05

Item = str | Sequence[int] | Sequence[Mapping[str, Any]]  # a prompt (text or token ids) or a chat (messages)


def as_input(item: Item) -> Input:
    """``(prompt, messages)`` for a prompt, or for a chat given as a list of message dicts."""
    if isinstance(item, str) or all(isinstance(t, int) for t in item):
        return (item, None)
    return (None, item)


class BackendClient:
    """Starts ``backend`` and waits until it is ready (or raises its error after ``ready_timeout`` seconds).

    Parameters the backend does not honour (its ``capabilities``) are refused with a
    :class:`~hetero_core.errors.ValidationError` naming the field, as the server refuses them with a 400.
    """

    def __init__(self, backend: ServingBackend, *, name: str | None = None, ready_timeout: float = 600.0) -> None:
        self.backend = backend
        self.name = name or type(backend).__name__  # as errors name the backend
        self.honoured = capabilities_of(
            backend, self.name
        )  # a misspelt capability fails here, before the backend starts
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hetero-backend-client", daemon=True)
        self._thread.start()
        self._loop.call_soon_threadsafe(backend.start, self._loop)
        deadline = time.monotonic() + ready_timeout
        while not backend.is_ready:
            if backend.error is not None or time.monotonic() > deadline:
                self.close()
                raise EngineError(
                    f"the serving backend did not become ready: {backend.error or f'timed out after {ready_timeout} s'}"
                )
            time.sleep(READY_POLL)

    def _honoured(self, params: GenerationParams) -> GenerationParams:
        field = unhonoured(params, self.honoured)
        if field is not None:
            raise ValidationError(f"{field} is not supported by the serving backend {self.name!r}", param=field)
        return params

    def generate(
        self,
        items: Sequence[Item],
        params: GenerationParams | None = None,
        *,
        on_finished: Callable[[Choice], None] | None = None,
    ) -> list[Choice]:
        """Every item's ``params.n`` choices, item by item in input order.
        ``on_finished`` hears each choice as it ends."""
        params = self._honoured(params or GenerationParams())

        inputs = [as_input(item) for item in items]

        async def run() -> list[Choice]:
            generation = Generation(self.backend, None, f"batch-{uuid.uuid4().hex}")
            await generation.start(lambda: (inputs, params))
            try:
                async for choice, delta in generation.deltas():
                    if delta.is_finished and on_finished is not None:
                        on_finished(choice)
            finally:
                if not generation.is_finished:
                    generation.abort()
            return generation.choices

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def stream(self, item: Item, params: GenerationParams | None = None) -> Iterator[StreamDelta]:
        """The deltas of one prompt (or chat) as they are produced; closing the iterator early aborts it."""
        params = self._honoured(params or GenerationParams())
        deltas: queue.Queue[StreamDelta | BaseException | None] = queue.Queue()

        async def run() -> None:
            generation = Generation(self.backend, None, f"stream-{uuid.uuid4().hex}")
            try:
                await generation.start(lambda: ([as_input(item)], params))
                async for _choice, delta in generation.deltas():
                    deltas.put(delta)
            except BaseException as exc:
                deltas.put(exc)
                raise
            finally:
                if not generation.is_finished:
                    generation.abort()
            deltas.put(None)

        future = asyncio.run_coroutine_threadsafe(run(), self._loop)
        try:
            while (delta := deltas.get()) is not None:
                if isinstance(delta, BaseException):
                    raise delta
                yield delta
        finally:
            if not future.done():
                future.cancel()

    def close(self, drain_timeout: float = 0.0) -> None:
        """Stop the backend (letting requests in flight finish for up to ``drain_timeout`` s) and the loop."""
        if self._loop.is_closed():
            return
        self.backend.stop(drain_timeout)
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> BackendClient:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


async def _cancel_the_rest() -> None:
    """Cancel the backend's remaining tasks and let them finish, so the loop closes clean."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
