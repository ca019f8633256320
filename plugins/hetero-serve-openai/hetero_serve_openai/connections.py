"""Bounded connections: how many stay open, how long a request's head may take, and how often exhaustion is logged.

uvicorn keeps a connection that never sends a request, or sends its head a
byte at a time, open forever; enough of them exhaust the process's file
descriptors and lock every client out. :class:`BoundedH11Protocol` closes a
connection whose request head has not arrived within ``read_timeout``
seconds, and at ``max_connections`` open connections a new one makes way
by closing the oldest idle one (no request in progress), or is itself
closed when every connection is serving a request. So a health check
always gets in. Running out of a system resource anyway (``EMFILE``) is
logged once per interval, not once per failed ``accept``.
"""

from __future__ import annotations

import asyncio
import errno
import math
import resource
import time
from typing import Any

import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

log = structlog.get_logger()

RESERVED_FILE_DESCRIPTORS = 128  # for the model files, logs, pipes and threads, beside the connections
DEFAULT_BACKLOG = 2048  # uvicorn's listen backlog
LOG_INTERVAL = 10.0  # seconds between two log lines about the same exhaustion
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class RateLimitedWarning:
    """A warning logged at most once per ``interval`` seconds, with how many were held back since."""

    def __init__(self, event: str, interval: float = LOG_INTERVAL) -> None:
        self.event, self.interval = event, interval
        self._last = -math.inf
        self._held_back = 0

    def __call__(self, **details: Any) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            self._held_back += 1
            return
        log.warning(self.event, held_back=self._held_back, **details)
        self._last, self._held_back = now, 0


def log_resource_exhaustion_once() -> Any:
    """An event-loop exception handler: resource exhaustion rate-limited, everything else as asyncio logs it."""
    warn = RateLimitedWarning("out of a system resource: new connections wait until some close")

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
            warn(error=f"{type(exc).__name__}: {exc}", context=context.get("message"))
            return
        loop.default_exception_handler(context)

    return handler


def fit_to_file_limit(max_connections: int, backlog: int = DEFAULT_BACKLOG) -> tuple[int, int]:
    """The connection cap and listen backlog this process's file descriptors can hold,
    as ``(max_connections, backlog)``.

    The soft limit is first raised to the hard one. asyncio accepts up to
    ``backlog`` connections in one burst, before any of them can be closed
    to make room, so both together must fit under the limit (less
    ``RESERVED_FILE_DESCRIPTORS``); if they do not, both are lowered, with a
    warning. Past the limit, ``accept`` fails with ``EMFILE``, and asyncio
    then schedules one retry per failed call: a storm of timers and log lines.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    budget = soft - RESERVED_FILE_DESCRIPTORS
    if soft == resource.RLIM_INFINITY or max_connections + backlog <= budget:
        return max_connections, backlog
    fitted_connections = max(1, min(max_connections, budget // 2))
    fitted_backlog = max(1, min(backlog, budget - fitted_connections))
    log.warning(
        "server.max_connections and the listen backlog lowered to fit the file-descriptor limit",
        max_connections=fitted_connections,
        backlog=fitted_backlog,
        configured=max_connections,
        limit=soft,
    )
    return fitted_connections, fitted_backlog


def bounded_protocol(max_connections: int, read_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with these bounds, for ``uvicorn.Config(http=...)``."""
    limit_reached = RateLimitedWarning("server.max_connections reached: closing idle connections to admit new ones")
    return type(
        "BoundedH11Protocol",
        (BoundedH11Protocol,),
        {
            "max_connections": max_connections,
            "read_timeout": read_timeout,
            "limit_reached": staticmethod(limit_reached),
        },
    )


class BoundedH11Protocol(H11Protocol):
    max_connections = 1024
    read_timeout = 30.0
    limit_reached = staticmethod(lambda **_: None)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.opened_at = time.monotonic()
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()
        if sum(1 for c in self.connections if not c.transport.is_closing()) > self.max_connections:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        if self.is_idle and self._head_timer is None:  # a new request's head begins
            self._arm_head_timer()
        super().data_received(data)
        if not self.is_idle:
            self._disarm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    @property
    def is_idle(self) -> bool:
        """No request in progress: none received yet, or the last one answered."""
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.read_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.is_idle and not self.transport.is_closing():
            self.transport.close()

    def _make_room(self) -> None:
        idle = [c for c in self.connections if c is not self and c.is_idle and not c.transport.is_closing()]
        self.limit_reached(max_connections=self.max_connections)
        if idle:
            min(idle, key=lambda c: c.opened_at).transport.close()
        else:  # every other connection is serving a request
            self.transport.close()
