"""One engine replica: the local-engine backend inside a Ray actor, streaming deltas back to the router.

The actor is asynchronous: its engine steps on its own thread (as in
``hetero-infer serve`` without replicas) and each ``generate`` call is a
streaming generator that yields the deltas a request produced since its
last yield, as lists, so a fast engine does not pay one object per token.
A generator the caller cancels aborts its request.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, AsyncIterator, Mapping, Sequence

import ray

from hetero_core.config import EngineConfig
from hetero_core.errors import EngineError
from hetero_core.logs import configure_logging
from hetero_core.metrics import EngineMetrics
from hetero_core.outputs import StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason
from hetero_core.serving import SINGLE_ENGINE
from hetero_serve_openai.async_engine import AsyncEngine
from hetero_serve_openai.errors import APIError

READY_POLL = 0.05  # seconds between checks that the engine has loaded


class ReplicaUnavailable(RuntimeError):
    """The replica's engine failed to load or went out of service."""


class EngineReplica:
    """Ray actor class (wrapped with ``ray.remote`` by the backend): one :class:`AsyncEngine`."""

    def __init__(self, config: EngineConfig, log_level: int) -> None:
        configure_logging(
            debug=log_level <= logging.DEBUG, quiet=log_level >= logging.WARNING
        )  # on stderr, as the front end's
        self._backend = AsyncEngine(config)
        self._started = False
        self._incarnation = uuid.uuid4().hex  # Ray restarts the actor in a new process, which builds it anew

    async def ready(self) -> dict[str, Any]:
        """Load the engine on the first call; return its limits once it can serve. Raises if it cannot."""
        if not self._started:
            self._started = True
            self._backend.start(asyncio.get_running_loop())
        while not self._backend.is_ready:
            if self._backend.error is not None:
                raise ReplicaUnavailable(self._backend.error)
            await asyncio.sleep(READY_POLL)
        engine = self._backend.engine
        return {
            "max_model_len": engine.max_model_len,
            "num_blocks": engine.num_blocks,
            "vocab_size": engine.model_info.vocab_size,
            "node_id": ray.get_runtime_context().get_node_id(),
            "incarnation": self._incarnation,
        }

    async def generate(
        self,
        prompt: str | Sequence[int] | None,
        messages: Sequence[Mapping[str, Any]] | None,
        params: GenerationParams,
        request_id: str,
    ) -> AsyncIterator[list[StreamDelta]]:
        """Submit a request and yield its deltas as they come, until each of its samples has finished.

        Input the engine refuses ends every sample at once with ``FinishReason.ERROR`` and the reason.
        """
        queue: asyncio.Queue[tuple[int, StreamDelta]] = asyncio.Queue()
        try:
            self._backend.submit(prompt, messages, params, request_id, queue, 0)
        except (EngineError, APIError) as exc:
            message = exc.message
            yield [
                StreamDelta(request_id, index, "", [], finish_reason=FinishReason.ERROR, error=message)
                for index in range(params.n)
            ]
            return
        open_samples = set(range(params.n))
        try:
            while open_samples:
                batch = [(await queue.get())[1]]
                while not queue.empty():
                    batch.append(queue.get_nowait()[1])
                for delta in batch:
                    if delta.is_finished:
                        open_samples.discard(delta.index)
                yield batch
        finally:
            if open_samples:  # the caller went away: stop generating for it
                self._backend.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._backend.abort(request_id)

    def metrics(self) -> EngineMetrics:
        """The engine's counters; raises when it is not serving (so a health check fails)."""
        if not self._backend.is_ready:
            raise ReplicaUnavailable(self._backend.error or "the engine is loading")
        return self._backend.engine_metrics()[SINGLE_ENGINE]
