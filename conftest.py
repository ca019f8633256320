"""Test-wide settings: keep the engine's per-request log lines out of test output; mark integration tests."""

import logging
from pathlib import Path

import pytest
import structlog

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

INTEGRATION = Path(__file__).parent / "tests" / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)
