"""Logging: library code asks :func:`get_logger`; only the programs (CLI and server) configure output.

Library loggers are structlog loggers over the standard ``logging`` module,
so an application that embeds the engine sees nothing unless it configures
logging itself: Python then shows only warnings and errors, on stderr
(``logging.lastResort``), as one line with the event's fields. The programs
call :func:`configure_logging`, which renders every line, the library's
and the rest of structlog's, as console lines on a terminal and JSON lines
otherwise.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

LIBRARY_LOGGER = "hetero_infer"  # the parent of every library logger


def _to_log_record(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """A stdlib record: the event and its fields as text, and the fields themselves for a structlog formatter."""
    exc_info = event_dict.pop("exc_info", None)
    fields = " ".join(f"{key}={value!r}" for key, value in event_dict.items() if key != "event")
    text = f"{event_dict.get('event', '')} {fields}".rstrip()
    return {"msg": text, "exc_info": exc_info, "extra": {"structlog_fields": dict(event_dict)}}


def get_logger(name: str) -> Any:
    """The logger for library module ``name`` (a child of ``hetero_infer``): nothing shows until logging is
    configured."""
    return structlog.wrap_logger(
        logging.getLogger(f"{LIBRARY_LOGGER}.{name}"),
        wrapper_class=structlog.stdlib.BoundLogger,
        processors=[structlog.stdlib.filter_by_level, _to_log_record],
    )


def _library_fields(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    record = event_dict.get("_record")
    fields = getattr(record, "structlog_fields", None)
    return {**event_dict, **fields} if fields is not None else event_dict


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written: a stream fixed at configuration would outlive
    its replacement (a closed one raised in every background task that logged after)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(*, debug: bool = False, quiet: bool = False) -> None:
    """Console lines on a terminal, JSON lines otherwise, on stderr."""
    level = logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO
    renderer = structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    shared = [structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso")]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(_Stderr()),
    )
    handler = logging.StreamHandler(_Stderr())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[_library_fields, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    library = logging.getLogger(LIBRARY_LOGGER)
    library.handlers[:] = [handler]
    library.setLevel(level)
    library.propagate = False
