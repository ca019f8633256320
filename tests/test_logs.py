"""Logging as the programs configure it."""

from __future__ import annotations

import io
import sys

import pytest
import structlog

from hetero_core.logs import configure_logging, get_logger


@pytest.mark.parametrize(
    "logger", [get_logger("hetero_core.test"), structlog.get_logger()], ids=["library", "structlog"]
)
def test_lines_go_to_the_stderr_of_the_moment_not_the_one_configured_with(monkeypatch, logger) -> None:
    """A stream replaced and closed after configuration (a test's capture; a daemon's redirect) is not
    written to again: a background task that logged there raised and died."""
    configured_with = io.StringIO()
    monkeypatch.setattr(sys, "stderr", configured_with)
    configure_logging()
    configured_with.close()
    now = io.StringIO()
    monkeypatch.setattr(sys, "stderr", now)
    logger.info("replica ready", replica=1)
    assert '"event": "replica ready"' in now.getvalue() and "Logging error" not in now.getvalue()
