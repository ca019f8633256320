"""The CLI configures logging for the process; put the test-wide settings back after each test."""

import logging

import pytest
import structlog

from hetero_core.logs import LIBRARY_LOGGER


@pytest.fixture(autouse=True)
def restore_logging():
    saved = structlog.get_config()
    library = logging.getLogger(LIBRARY_LOGGER)
    handlers, level, propagate = list(library.handlers), library.level, library.propagate
    yield
    structlog.configure(**saved)
    library.handlers[:], library.level, library.propagate = handlers, level, propagate
