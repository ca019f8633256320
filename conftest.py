"""Test-wide settings: keep the engine's per-request log lines out of test output; mark integration tests;
give the run a weight cache of its own, so that it neither reads nor fills the user's."""

import atexit
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import structlog

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

pytest_plugins = ["hetero_core.testing.plugin_isolation"]  # puts logging back after every test

INTEGRATION = Path(__file__).parent / "tests" / "integration"
WEIGHT_CACHE_ENV = "HETERO_WEIGHT_CACHE"  # hetero_executor_torch.weight_cache.CACHE_ENV; subprocesses inherit it

if WEIGHT_CACHE_ENV not in os.environ:
    os.environ[WEIGHT_CACHE_ENV] = tempfile.mkdtemp(prefix="hetero-test-weights-")
    atexit.register(shutil.rmtree, os.environ[WEIGHT_CACHE_ENV], ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)
