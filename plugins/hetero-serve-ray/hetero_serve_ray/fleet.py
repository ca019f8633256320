"""The replica actors: placed on the cluster, watched, taken out of routing when lost, back when Ray restarts them.

A replica's counters outlive its process: each restart (a new incarnation,
as its ``ready`` answer says) starts the engine's counters at 0, so the
front end adds the last counters it saw of the earlier incarnations, and
counts the requests it ended with an error because the replica failed.
``/metrics`` then never goes backwards while the front end runs.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import attrs
import ray
import ray.exceptions
import structlog

from hetero_core.config import EngineConfig
from hetero_core.metrics import EngineMetrics
from hetero_core.sequence import FinishReason
from hetero_serve_ray.admission import Limits
from hetero_serve_ray.cluster import connect
from hetero_serve_ray.replica import EngineReplica, ReplicaUnavailable

log = structlog.get_logger()

REPLICA_LOST = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)  # the process is gone or unreachable
RESTART_POLL = 0.2  # seconds between attempts to reach a replica that is restarting
GAUGES = ("num_running", "num_waiting", "kv_cache_usage")  # the EngineMetrics fields that are not counters


@attrs.define(eq=False)
class Replica:
    """The front end's view of one replica actor."""

    index: int
    actor: Any
    is_ready: bool = False
    has_started: bool = False  # it was ready once, or failed to load
    node_id: str | None = None  # the Ray node it runs on
    load: int = 0  # outstanding tokens of the requests routed here
    metrics: EngineMetrics | None = None  # from the last health check of this incarnation (kept while it is lost)
    incarnation: str | None = None  # the actor process's, from ``ready``: a new one after each restart
    past: EngineMetrics = attrs.field(
        factory=EngineMetrics
    )  # counters of earlier incarnations and of front-end failures
    failure: str | None = None  # why it is out of routing
    lost: asyncio.Event = attrs.field(factory=asyncio.Event)  # set when a stream saw it die

    def counters(self) -> EngineMetrics:
        """Its counters over every incarnation; its gauges while it is ready, else 0 (nothing runs there)."""
        total = add_counters(self.past, self.metrics)
        if self.is_ready and self.metrics is not None:
            total.num_running, total.num_waiting, total.kv_cache_usage = (
                self.metrics.num_running,
                self.metrics.num_waiting,
                self.metrics.kv_cache_usage,
            )
        return total

    def count_failure(self) -> None:
        """Count a request the front end ended with an error because this replica failed (it never finished it)."""
        self.past.requests_finished[FinishReason.ERROR] += 1


class Fleet:
    """``config.data_parallel_size`` replicas of ``config``'s engine.

    :param address: the Ray cluster to join; None starts a private one (see :func:`~hetero_serve_ray.cluster.connect`).
    :param actor_options: Ray actor options (resources, restarts, placement, runtime environment).
    :param on_lost: called with a replica's index when it leaves routing.
    """

    def __init__(
        self,
        config: EngineConfig,
        address: str | None,
        actor_options: dict[str, Any],
        health_check_interval: float,
        health_check_timeout: float,
        on_lost: Callable[[int], None],
    ) -> None:
        self.config = config
        self.address = address
        self.actor_options = actor_options
        self.health_check_interval = health_check_interval
        self.health_check_timeout = health_check_timeout
        self.on_lost = on_lost
        self.replicas: list[Replica] = []
        self.limits: Limits | None = None  # what the engines admit, from the first replica ready
        self.error: str | None = None  # set when no replica can ever serve
        self._owns_ray = False

    def place(self) -> None:
        """Join (or start) the cluster and create the actors. Blocks."""
        self._owns_ray = connect(self.address)
        replica_config = self.config.evolve(data_parallel_size=1)
        actor_class = ray.remote(EngineReplica).options(**self.actor_options)
        log_level = structlog.get_logger().bind().get_effective_level()  # replicas log like the front end
        self.replicas = [
            Replica(index, actor_class.remote(replica_config, log_level))
            for index in range(self.config.data_parallel_size)
        ]
        available = ray.cluster_resources().get("CPU", 0)
        wanted = self.actor_options["num_cpus"] * len(self.replicas)
        if wanted > available:
            log.warning(
                "the cluster has fewer CPUs than the replicas reserve: some wait for nodes to join",
                cpus=available,
                reserved=wanted,
            )
        log.info("replicas placed", replicas=len(self.replicas), address=ray.get_runtime_context().gcs_address)

    def shutdown(self) -> None:
        """End the actors, and the cluster if :meth:`place` started it. Blocks."""
        for replica in self.replicas:
            ray.kill(replica.actor, no_restart=True)
        if self._owns_ray:
            ray.shutdown()

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.is_ready]

    def engine_metrics(self) -> dict[str, EngineMetrics]:
        """Every replica that has reported: counters since the front end started, gauges while it is ready (else 0)."""
        return {str(r.index): r.counters() for r in self.replicas if r.metrics is not None or r.past != EngineMetrics()}

    async def watch(self, replica: Replica) -> None:
        """Wait for the replica's engine; then check its health until it is lost, and wait for its restart."""
        while True:
            try:
                info = await replica.actor.ready.remote()
            except ray.exceptions.RayTaskError as exc:  # its engine cannot load: a restart would not help
                replica.failure, replica.has_started = f"replica {replica.index} cannot serve: {cause(exc)}", True
                log.error("replica failed to load", replica=replica.index, error=replica.failure)
                if all(r.failure is not None and not r.is_ready for r in self.replicas):
                    self.error = replica.failure
                return
            except REPLICA_LOST:
                await asyncio.sleep(RESTART_POLL)
                continue
            self.limits, replica.node_id = Limits.of(self.config, info), info["node_id"]
            if info["incarnation"] != replica.incarnation:  # a restarted process: its counters start again at 0
                replica.past = add_counters(replica.past, replica.metrics)
                replica.incarnation, replica.metrics = info["incarnation"], None
            replica.lost.clear()
            replica.is_ready, replica.has_started, replica.failure = True, True, None
            log.info("replica ready", replica=replica.index, node_id=replica.node_id)
            await self._check_health(replica)

    async def _check_health(self, replica: Replica) -> None:
        """Refresh the replica's metrics every interval; return once it is lost."""
        while replica.is_ready:
            try:
                replica.metrics = await asyncio.wait_for(
                    _awaitable(replica.actor.metrics.remote()), self.health_check_timeout
                )
            except ray.exceptions.RayTaskError as exc:  # alive, but its engine went out of service: restart it
                self.lose(replica, f"out of service: {cause(exc)}")
                ray.kill(replica.actor, no_restart=False)
                return
            except (*REPLICA_LOST, asyncio.TimeoutError) as exc:
                self.lose(replica, f"{type(exc).__name__}: {exc}")
                return
            try:
                await asyncio.wait_for(replica.lost.wait(), self.health_check_interval)
            except asyncio.TimeoutError:
                continue

    def lose(self, replica: Replica, why: str) -> None:
        """Take the replica out of routing (its watcher then waits for Ray to restart it)."""
        if replica.is_ready:
            log.warning("replica lost", replica=replica.index, error=why)
        replica.is_ready, replica.failure = False, why
        replica.lost.set()
        self.on_lost(replica.index)


def add_counters(total: EngineMetrics, more: EngineMetrics | None) -> EngineMetrics:
    """A new ``EngineMetrics``: the counters of ``total`` plus those of ``more``; gauges 0."""
    more = more or EngineMetrics()
    summed = {}
    for field in attrs.fields(EngineMetrics):
        if field.name in GAUGES:
            continue
        mine, theirs = getattr(total, field.name), getattr(more, field.name)
        summed[field.name] = {key: mine[key] + theirs[key] for key in mine} if isinstance(mine, dict) else mine + theirs
    return EngineMetrics(**summed)


async def _awaitable(ref: Any) -> Any:
    return await ref


def cause(exc: ray.exceptions.RayTaskError) -> str:
    """What a replica raised, in words."""
    raised = exc.cause
    if isinstance(raised, ReplicaUnavailable):
        return str(raised)
    return f"{type(raised).__name__}: {raised}"
