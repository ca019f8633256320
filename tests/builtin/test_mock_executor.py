"""The mock executor keeps the executor contract, so engine tests built on it mean something."""

from __future__ import annotations

import pytest

from hetero_core.builtin import MockExecutor
from hetero_core.testing import ExecutorContract


class TestMockExecutorContract(ExecutorContract):
    @pytest.fixture(scope="class")
    @classmethod
    def executor(cls):
        return MockExecutor()
