"""Runs an :class:`InferenceEngine` on its own thread and feeds each request's deltas to an asyncio queue.

The event loop never blocks on the model: submissions and aborts are the
engine's thread-safe calls, and the stepping thread hands every delta back
to the loop with ``call_soon_threadsafe``. One engine serves every request
through continuous batching; there is no lock around generation.

A step that raises (a fault in a component, not a failing executor, which
the engine itself retries and reports per request) fails every request in
flight with an error that names a logged id; after
``MAX_CONSECUTIVE_STEP_FAILURES`` such steps in a row the engine is taken
out of service (``error`` is set), which stops the server. A model that
fails to load sets ``error`` too.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

import attrs
import structlog

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.metrics import EngineMetrics
from hetero_core.outputs import StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.protocols import Tokenizer
from hetero_core.sequence import FinishReason
from hetero_core.serving import SINGLE_ENGINE
from hetero_serve_openai.capabilities import CAPABILITIES
from hetero_serve_openai.errors import APIError

log = structlog.get_logger()

IDLE_WAIT = 0.05  # seconds the stepping thread sleeps when idle, unless woken by a submission
MAX_CONSECUTIVE_STEP_FAILURES = 3


@attrs.define
class _InFlight:
    """A submitted request as the server sees it: where its deltas go, which samples are still open."""

    deliver: Callable[[StreamDelta], None]
    open_samples: set[int]


class AsyncEngine:
    """The ``local_engine`` serving backend (a :class:`~hetero_core.serving.ServingBackend`)."""

    error_status = 500  # a generation that fails is the server's fault
    capabilities = CAPABILITIES  # the engine honours every parameter

    def __init__(
        self, config: EngineConfig, *, engine_factory: Callable[[EngineConfig], InferenceEngine] = InferenceEngine
    ) -> None:
        self.config = config
        self._factory = engine_factory
        self.engine: InferenceEngine | None = None
        self.error: str | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight: dict[str, _InFlight] = {}
        self._in_flight_lock = threading.Lock()

    @property
    def is_ready(self) -> bool:
        return self.engine is not None and self.error is None

    @property
    def tokenizer(self) -> Tokenizer | None:
        return None if self.engine is None else self.engine.tokenizer

    @property
    def max_model_len(self) -> int | None:
        return None if self.engine is None else self.engine.max_model_len

    def engine_metrics(self) -> dict[str, EngineMetrics]:
        return {} if self.engine is None else {SINGLE_ENGINE: self.engine.metrics}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Build the engine (load and warm the model) and step it, on a background thread."""
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="hetero-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.engine = self._factory(self.config)
        except Exception as exc:  # reported by /readyz and every request
            self.error = f"the model failed to load: {type(exc).__name__}: {exc}"
            log.error("engine failed to start", error=self.error)
            return
        engine = self.engine
        consecutive_failures = 0
        while not self._stopping.is_set():
            if not engine.has_pending_work():
                self._wake.wait(IDLE_WAIT)
                self._wake.clear()
                continue
            try:
                engine.step()
            except Exception as exc:
                consecutive_failures += 1
                error_id = uuid.uuid4().hex[:12]
                log.error("engine step failed", error_id=error_id, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
                if consecutive_failures >= MAX_CONSECUTIVE_STEP_FAILURES:  # out of service before anyone hears of it
                    self.error = (
                        f"the engine stopped after {consecutive_failures} failed steps in a row (last id {error_id})"
                    )
                    log.error("engine out of service", error=self.error)
                self._fail_in_flight(f"internal error (id {error_id})")
                if self.error is not None:
                    break
            else:
                consecutive_failures = 0
        engine.close()

    def _fail_in_flight(self, message: str) -> None:
        """Finish every open sample of every request in flight with ``message``, and abort them in the engine."""
        with self._in_flight_lock:
            failed, self._in_flight = self._in_flight, {}
        for request_id, entry in failed.items():
            for index in sorted(entry.open_samples):
                entry.deliver(StreamDelta(request_id, index, "", [], finish_reason=FinishReason.ERROR, error=message))
            assert self.engine is not None
            self.engine.abort_request(request_id)

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
        if self.engine is None or self._loop is None or self.error is not None:
            raise APIError(
                503, f"the engine is unavailable: {self.error or 'not started'}", headers={"Retry-After": "5"}
            )
        loop = self._loop

        def deliver(delta: StreamDelta) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (tag, delta))

        def on_output(delta: StreamDelta) -> None:
            with self._in_flight_lock:
                entry = self._in_flight.get(request_id)
                if entry is None:  # already failed by a faulty step
                    return
                if delta.is_finished:
                    entry.open_samples.discard(delta.index)
                    if not entry.open_samples:
                        del self._in_flight[request_id]
            deliver(delta)

        with self._in_flight_lock:
            self._in_flight[request_id] = _InFlight(deliver, set(range(params.n)))
        try:
            if messages is not None:
                self.engine.submit_chat(messages, params, request_id=request_id, on_output=on_output)
            else:
                self.engine.submit_request(prompt, params, request_id=request_id, on_output=on_output)
        except Exception:
            with self._in_flight_lock:
                self._in_flight.pop(request_id, None)
            raise
        self._wake.set()

    def abort(self, request_id: str) -> None:
        if self.engine is not None and self.engine.abort_request(request_id):
            self._wake.set()

    def stop(self, drain_timeout: float) -> None:
        """Let in-flight requests finish (up to ``drain_timeout`` seconds), then stop stepping."""
        deadline = time.monotonic() + drain_timeout
        while self.is_ready and self.engine.has_pending_work() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
