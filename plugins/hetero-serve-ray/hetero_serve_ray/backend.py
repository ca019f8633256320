"""The ``ray`` serving backend: ``data_parallel_size`` engine replicas as Ray actors behind one front end.

The front end (this process) joins or starts a Ray cluster, places one
:class:`~hetero_serve_ray.replica.EngineReplica` actor per replica and keeps
the model's tokenizer, which the router needs to see prompts as blocks.
Each request is routed (:mod:`hetero_serve_ray.routing`) to a ready replica
and streamed back delta by delta; a client that leaves cancels the stream,
which aborts the request on its replica.

Faults: a replica whose stream breaks, or that fails a health check, is
taken out of routing at once. Requests it had not started (nothing was
streamed to their client yet) go to another ready replica; requests in
flight end with an error (503 before the response, an error event within a
stream). Ray restarts the actor (``max_restarts``); routing resumes once its
engine reports ready again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any, Callable, Mapping, Sequence

import attrs
import ray
import ray.exceptions
import structlog

from hetero_core.config import EngineConfig
from hetero_core.errors import ValidationError
from hetero_core.metrics import EngineMetrics
from hetero_core.outputs import StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.protocols import Tokenizer
from hetero_core.sequence import FinishReason
from hetero_core.serving import DeltaQueue
from hetero_serve_openai.capabilities import CAPABILITIES
from hetero_serve_openai.errors import APIError
from hetero_serve_ray.cluster import restore_signal_handlers
from hetero_serve_ray.fleet import REPLICA_LOST, Fleet, Replica, cause
from hetero_serve_ray.options import RayBackendOptions
from hetero_serve_ray.routing import ReplicaLoad, make_policy

log = structlog.get_logger()

DRAIN_POLL = 0.05  # seconds between checks that requests in flight have finished
TASKS_END_TIMEOUT = 10.0  # seconds the backend's own tasks get to end at shutdown


@attrs.define(eq=False)
class Flight:
    """A request between submission and its last delta."""

    request_id: str
    prompt: str | Sequence[int] | None
    messages: Sequence[Mapping[str, Any]] | None
    params: GenerationParams
    token_ids: list[int]
    queue: DeltaQueue
    tag: int
    open_samples: set[int]
    cost: int = 0  # tokens it still counts against its replica's load
    replica: Replica | None = None
    stream: Any = None  # the replica's ObjectRefGenerator
    is_started: bool = False  # a delta reached the client: it can no longer move to another replica
    task: asyncio.Task | None = None

    @property
    def full_cost(self) -> int:
        """Its load on a replica before any token: the prompt and every sample's ``max_tokens``."""
        return len(self.token_ids) + self.params.n * self.params.max_tokens


class RayBackend:
    """Data-parallel replicas on Ray (a :class:`~hetero_core.serving.ServingBackend`).

    :param options: routing, resources, restarts and health checks (see
        :class:`~hetero_serve_ray.options.RayBackendOptions`; the defaults when None).
    """

    capabilities = CAPABILITIES  # each replica is a local engine, which honours every parameter
    error_status = 503  # a replica failed: the service is degraded, another try may succeed

    def __init__(self, config: EngineConfig, options: RayBackendOptions | None = None) -> None:
        options = options or RayBackendOptions()
        self.config = config
        self.policy = make_policy(options.routing, config.block_size, dict(options.routing_options))
        num_threads = options.num_threads_per_replica or max(1, round(options.num_cpus_per_replica + 0.49))
        actor_options = {
            "num_cpus": options.num_cpus_per_replica,
            "num_gpus": options.num_gpus_per_replica,
            "max_restarts": options.max_restarts,
            "max_task_retries": 0,  # a request is never replayed behind the router's back
            "scheduling_strategy": "SPREAD",  # one replica per node while nodes last
            "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(num_threads)}},
        }
        self.fleet = Fleet(
            config,
            options.address,
            actor_options,
            options.health_check_interval,
            options.health_check_timeout,
            self.policy.forget,
        )
        self._flights: dict[str, Flight] = {}
        self._tokenizer: Tokenizer | None = None
        self._error: str | None = None  # the fleet could not be placed
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ health

    @property
    def replicas(self) -> list[Replica]:
        return self.fleet.replicas

    @property
    def is_ready(self) -> bool:
        """Once every replica has started (or failed to load): while at least one of them is ready."""
        return (
            self.error is None and all(r.has_started for r in self.replicas) and any(r.is_ready for r in self.replicas)
        )

    @property
    def error(self) -> str | None:
        return self._error or self.fleet.error

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self._tokenizer

    @property
    def max_model_len(self) -> int | None:
        return None if self.fleet.limits is None else self.fleet.limits.max_model_len

    def engine_metrics(self) -> dict[str, EngineMetrics]:
        return self.fleet.engine_metrics()

    # ------------------------------------------------------------------ starting and stopping

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._spawn(self._launch())

    def _spawn(self, coroutine: Any) -> asyncio.Task:
        assert self._loop is not None
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _launch(self) -> None:
        try:
            await asyncio.to_thread(self._connect)
        except Exception as exc:  # reported by /readyz and every request
            self._error = f"the replicas could not be started: {type(exc).__name__}: {exc}"
            log.error("ray backend failed to start", error=self._error)
            return
        finally:
            # ray.init replaced SIGTERM's; this runs on the loop's thread, the main one in `serve`
            restore_signal_handlers()
        for replica in self.replicas:
            self._spawn(self.fleet.watch(replica))

    def _connect(self) -> None:
        """Place the replicas and build the router's tokenizer."""
        self.fleet.place()
        pm = create_plugin_manager(disable=self.config.plugins.disable, load=self.config.plugins.load)
        spec = self.config.tokenizer
        self._tokenizer = ComponentRegistry(pm).create("tokenizer", spec.name, spec.options, self.config)

    def stop(self, drain_timeout: float) -> None:
        """Let requests in flight finish (up to ``drain_timeout`` s), then end the replicas
        (and a cluster started here)."""
        deadline = time.monotonic() + drain_timeout
        while self._flights and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL)
        if self._loop is not None and not self._loop.is_closed():
            # the health checks and streams must be over before the actors go: Ray aborts the process
            # when its core worker is torn down under a call still in flight
            ended = asyncio.run_coroutine_threadsafe(self._end_tasks(), self._loop)
            try:
                ended.result(timeout=TASKS_END_TIMEOUT)
            except (concurrent.futures.TimeoutError, RuntimeError):
                log.warning("ray backend tasks still running at shutdown", num_tasks=len(self._tasks))
        self.fleet.shutdown()

    async def _end_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ requests

    def submit(
        self,
        prompt: str | Sequence[int] | None,
        messages: Sequence[Mapping[str, Any]] | None,
        params: GenerationParams,
        request_id: str,
        queue: DeltaQueue,
        tag: int,
    ) -> None:
        """Check and tokenize the request on the calling thread, then route it on the event loop."""
        if self.error is not None:
            raise APIError(503, f"the engine is unavailable: {self.error}")
        if not any(r.is_ready for r in self.replicas):
            raise APIError(503, "no replica is ready", headers={"Retry-After": "5"})
        token_ids = self._prompt_tokens(prompt, messages)
        assert self.fleet.limits is not None  # set before any replica is ready
        self.fleet.limits.check(token_ids, messages is not None or isinstance(prompt, str), params)
        flight = Flight(request_id, prompt, messages, params, token_ids, queue, tag, set(range(params.n)))
        if self._flights.setdefault(request_id, flight) is not flight:
            raise ValidationError(f"request id {request_id!r} is already in use", param="request_id")
        self._on_loop(self._begin, flight)

    def _begin(self, flight: Flight) -> None:
        if flight.open_samples:  # not aborted before it reached the loop
            flight.task = self._spawn(self._drive(flight))

    def _on_loop(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback`` now when called on the event loop, else queue it there: flights change only on the loop."""
        assert self._loop is not None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            callback(*args)
        else:
            self._loop.call_soon_threadsafe(callback, *args)

    def _prompt_tokens(
        self, prompt: str | Sequence[int] | None, messages: Sequence[Mapping[str, Any]] | None
    ) -> list[int]:
        """The prompt as the engine will see it (the router keys on its blocks)."""
        tokenizer = self._tokenizer
        assert tokenizer is not None
        if messages is not None:
            return tokenizer.encode(
                tokenizer.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False
            )
        if isinstance(prompt, str):
            return tokenizer.encode(prompt)
        return list(prompt or ())

    def abort(self, request_id: str) -> None:
        """End the request; cancelling its stream aborts it on the replica (or keeps it from starting)."""
        if self._loop is not None:
            self._on_loop(self._abort, request_id)

    def _abort(self, request_id: str) -> None:
        flight = self._flights.get(request_id)
        if flight is None:
            return
        if flight.stream is not None:
            ray.cancel(flight.stream)
        if flight.task is not None:
            flight.task.cancel()
        self._finish(flight, FinishReason.ABORT, None)

    def _route(self, flight: Flight, tried: set[int]) -> Replica | None:
        candidates = [ReplicaLoad(r.index, r.load) for r in self.replicas if r.is_ready and r.index not in tried]
        if not candidates:
            return None
        return self.replicas[self.policy.choose(flight.token_ids, candidates)]

    async def _drive(self, flight: Flight) -> None:
        """Route the request and stream it back; move it if its replica dies before it started."""
        tried: set[int] = set()
        while flight.open_samples:
            replica = self._route(flight, tried)
            if replica is None:
                why = (
                    "no replica is ready" if not tried else f"replica {max(tried)} failed and no other replica is ready"
                )
                self._finish(flight, FinishReason.ERROR, why, self.replicas[max(tried)] if tried else None)
                return
            tried.add(replica.index)
            flight.replica, flight.cost = replica, flight.full_cost
            replica.load += flight.cost
            try:
                await self._stream(flight, replica)
            except REPLICA_LOST as exc:
                self.fleet.lose(replica, f"{type(exc).__name__}: {exc}")
                if flight.is_started:
                    self._finish(
                        flight,
                        FinishReason.ERROR,
                        f"replica {replica.index} failed while generating; retry the request",
                        replica,
                    )
                    return
                log.info(
                    "rerouting a request its replica never started", request_id=flight.request_id, replica=replica.index
                )
            except ray.exceptions.RayTaskError as exc:  # a fault inside the replica's generate, not a death
                self._finish(flight, FinishReason.ERROR, f"replica {replica.index}: {cause(exc)}", replica)
                return
            finally:
                replica.load -= flight.cost
                flight.cost, flight.replica, flight.stream = 0, None, None

    async def _stream(self, flight: Flight, replica: Replica) -> None:
        flight.stream = replica.actor.generate.options(num_returns="streaming").remote(
            flight.prompt, flight.messages, flight.params, flight.request_id
        )
        async for ref in flight.stream:
            for delta in await ref:
                self._deliver(flight, replica, delta)

    def _deliver(self, flight: Flight, replica: Replica, delta: StreamDelta) -> None:
        if delta.index not in flight.open_samples:
            return
        flight.is_started = True
        produced = min(len(delta.token_ids), flight.cost)
        flight.cost -= produced
        replica.load -= produced
        if delta.is_finished:
            flight.open_samples.discard(delta.index)
            if not flight.open_samples:
                self._flights.pop(flight.request_id, None)
        flight.queue.put_nowait((flight.tag, delta))

    def _finish(self, flight: Flight, reason: FinishReason, error: str | None, failed: Replica | None = None) -> None:
        """End every open sample of ``flight`` here, in the front end; counted as ``failed``'s
        (no replica counts it)."""
        if failed is not None and flight.open_samples:
            failed.count_failure()
        for index in sorted(flight.open_samples):
            flight.queue.put_nowait(
                (flight.tag, StreamDelta(flight.request_id, index, "", [], finish_reason=reason, error=error))
            )
        flight.open_samples.clear()
        self._flights.pop(flight.request_id, None)
