"""Runs an :class:`InferenceEngine` on its own thread and feeds each request's deltas to an asyncio queue.

The event loop never blocks on the model: submissions and aborts are the
engine's thread-safe calls, and the stepping thread hands every delta back
to the loop with ``call_soon_threadsafe``. One engine serves every request
through continuous batching; there is no lock around generation.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import structlog

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.outputs import CompletedRequest, StreamDelta
from hetero_core.params import GenerationParams

log = structlog.get_logger()

IDLE_WAIT = 0.05  # seconds the stepping thread sleeps when idle, unless woken by a submission


class AsyncEngine:
    """The local-engine backend of the server."""

    error_status = 500  # a generation that fails is the server's fault

    def __init__(self, config: EngineConfig, *, engine_factory: Callable[[EngineConfig], InferenceEngine] = InferenceEngine) -> None:
        self.config = config
        self._factory = engine_factory
        self.engine: InferenceEngine | None = None
        self.error: str | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_finished: Callable[[CompletedRequest], None] | None = None

    @property
    def is_ready(self) -> bool:
        return self.engine is not None

    @property
    def tokenizer(self):
        return None if self.engine is None else self.engine.tokenizer

    def engine_metrics(self):
        return None if self.engine is None else self.engine.metrics

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Build the engine (load and warm the model) and step it, on a background thread."""
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="hetero-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.engine = self._factory(self.config)
        except Exception as exc:  # reported by /readyz and every request
            self.error = f"{type(exc).__name__}: {exc}"
            log.error("engine failed to start", error=self.error)
            return
        engine = self.engine
        while not self._stopping.is_set():
            if not engine.has_pending_work():
                self._wake.wait(IDLE_WAIT)
                self._wake.clear()
                continue
            try:
                finished = engine.step()
            except Exception:  # a bug in a component: keep serving the others
                log.exception("engine step failed")
                continue
            if self.on_finished is not None:
                for record in finished:
                    self.on_finished(record)
        engine.close()

    def submit(
        self,
        prompt: str | Sequence[int] | None,
        messages: Sequence[Mapping[str, Any]] | None,
        params: GenerationParams,
        request_id: str,
        queue: asyncio.Queue[tuple[int, StreamDelta]],
        tag: int,
    ) -> None:
        """Queue a request; its deltas arrive on ``queue`` as ``(tag, delta)``. Raises the engine's errors."""
        assert self.engine is not None and self._loop is not None
        loop = self._loop

        def on_output(delta: StreamDelta) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (tag, delta))

        if messages is not None:
            self.engine.submit_chat(messages, params, request_id=request_id, on_output=on_output)
        else:
            self.engine.submit_request(prompt, params, request_id=request_id, on_output=on_output)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        if self.engine is not None and self.engine.abort_request(request_id):
            self._wake.set()

    def num_in_flight(self) -> int:
        return 0 if self.engine is None else self.engine.metrics.num_running + self.engine.metrics.num_waiting

    def stop(self, drain_timeout: float) -> None:
        """Let in-flight requests finish (up to ``drain_timeout`` seconds), then stop stepping."""
        deadline = time.monotonic() + drain_timeout
        while self.engine is not None and self.engine.has_pending_work() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
