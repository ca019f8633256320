"""The serving backend contract: what the OpenAI server (``hetero-serve-openai``) talks to.

A backend is registered by name through the ``register_serving_backends``
hook; the server's config (``server.backend``, or ``data_parallel_backend``
for replicas) picks one, and the server only ever uses the members of
:class:`ServingBackend`. ``local_engine`` and ``command_bridge`` come with
the server; ``ray`` (data-parallel replicas) with ``hetero-serve-ray``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from hetero_core.metrics import EngineMetrics
from hetero_core.params import GenerationParams
from hetero_core.protocols import Tokenizer

SINGLE_ENGINE = ""  # the engine_metrics() key of a backend with one engine: exported without a replica label

DeltaQueue = asyncio.Queue  # of (tag, StreamDelta)


@runtime_checkable
class ServingBackend(Protocol):
    """Submit requests, stream their deltas, abort them, report health and metrics.

    A backend may declare ``capabilities``: a frozenset of the
    :class:`~hetero_core.params.GenerationParams` field names it honours
    (``hetero_serve_openai.capabilities.CAPABILITIES`` for all of them). The
    server refuses, with a 400 naming the request field, a request that sets
    any other field; ``max_tokens``, ``temperature`` and ``top_p`` are honoured
    by every backend, and are all a backend without the attribute is sent.

    The server calls :meth:`submit` on a worker thread (it tokenizes and
    checks the input there, off the event loop), :meth:`abort` from the event
    loop or from that worker thread (to withdraw a request whose siblings
    were refused), and :meth:`stop`, which may block, on a worker thread;
    everything else from the event loop. Deltas are always put on the queue
    from the event loop.
    """

    #: the HTTP status of a request whose generation failed (500: the server's fault, 502: a program's,
    #: 503: a replica's)
    error_status: int

    @property
    def is_ready(self) -> bool:
        """True while the backend can take requests (``/readyz`` answers 200); False while loading or out of service."""

    @property
    def error(self) -> str | None:
        """Why the backend is out of service for good (a model that failed to load): the server then stops; or None."""

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The model's tokenizer, for ``/tokenize``, chat templates, echo, stop ids and logprobs; None if the backend
        has none."""

    @property
    def max_model_len(self) -> int | None:
        """Prompt plus output tokens one request may hold (model cards, ``/tokenize``, chat's default ``max_tokens``);
        None when unknown."""

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin loading, without blocking ``loop``; deltas will be delivered on ``loop``."""

    def stop(self, drain_timeout: float) -> None:
        """Let requests in flight finish for up to ``drain_timeout`` seconds, then release everything. Blocks."""

    def submit(
        self,
        prompt: str | Sequence[int] | None,
        messages: Sequence[Mapping[str, Any]] | None,
        params: GenerationParams,
        request_id: str,
        queue: DeltaQueue,
        tag: int,
    ) -> None:
        """Queue one request: a prompt (text or token ids) or, when ``messages`` is given, a chat. Thread-safe.

        Every :class:`~hetero_core.outputs.StreamDelta` of it is put on ``queue`` as ``(tag, delta)``
        as it is produced, on the event loop; each of the ``params.n`` samples ends with a delta
        carrying a finish reason (``error`` set when it failed). Input the backend can refuse at
        once raises :class:`~hetero_core.errors.EngineError` (or the server's ``APIError``, with its own
        HTTP status) and queues nothing.
        """

    def abort(self, request_id: str) -> None:
        """Cancel a request; its open samples end with ``FinishReason.ABORT``. Unknown or finished ids are ignored.
        Thread-safe."""

    def engine_metrics(self) -> Mapping[str, EngineMetrics]:
        """The engines' counters by replica name; a single engine under ``SINGLE_ENGINE``; empty when there is none."""
