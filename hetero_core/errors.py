"""The one exception family the engine raises.

Every error carries a ``kind`` so front ends can map it to a status code
without matching on message text: configuration problems and invalid
parameters are the caller's fault, memory and execution problems are the
engine's.
"""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    CONFIG = "config"
    VALIDATION = "validation"
    MEMORY = "memory"
    EXECUTION = "execution"
    SCHEDULER = "scheduler"


class EngineError(Exception):
    """Base of every error raised by hetero-infer.

    ``param`` names the offending field when one is to blame, so the HTTP
    server can fill OpenAI's ``error.param``.
    """

    kind: ErrorKind = ErrorKind.EXECUTION

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ConfigError(EngineError):
    """The engine configuration or plugin selection is invalid."""

    kind = ErrorKind.CONFIG


class ValidationError(EngineError):
    """A request or its generation parameters are invalid."""

    kind = ErrorKind.VALIDATION


class CacheMemoryError(EngineError):
    """The KV cache cannot hold what was asked of it."""

    kind = ErrorKind.MEMORY


class ExecutionError(EngineError):
    """The executor failed to run a batch."""

    kind = ErrorKind.EXECUTION


class SchedulerError(EngineError):
    """The scheduler cannot accept or place a request (for example a full queue)."""

    kind = ErrorKind.SCHEDULER
