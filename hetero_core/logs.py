"""Logging setup for the programs (CLI and server); libraries only call ``structlog.get_logger()``."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(*, debug: bool = False, quiet: bool = False) -> None:
    """Console lines on a terminal, JSON lines otherwise, on stderr."""
    level = logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO
    renderer = structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
