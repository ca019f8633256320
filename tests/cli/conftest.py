"""The CLI configures logging for the process; put the test-wide settings back after each test."""

import pytest
import structlog


@pytest.fixture(autouse=True)
def restore_logging():
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
