"""Contract tests any plugin can run against itself: subclass the class for your extension point.

The checks are plain ``assert`` statements; pytest rewrites them (registered
below, before the modules load), so a failing check shows the values it
compared. Install the dependencies with ``pip install hetero-core[testing]``.
:mod:`hetero_core.testing.reference` is a plugin with a ``reference`` scheduler
policy and cache allocator, for running a component in an engine without
the project's other plugins.
"""

import pytest

pytest.register_assert_rewrite(
    *(
        f"hetero_core.testing.{module}"
        for module in (
            "cache_allocator",
            "executor",
            "scheduler_policy",
            "speculator",
            "structured_output",
            "tokenizer",
        )
    )
)

from hetero_core.testing.cache_allocator import CacheAllocatorContract
from hetero_core.testing.executor import ExecutorContract
from hetero_core.testing.scheduler_policy import SchedulerPolicyContract
from hetero_core.testing.speculator import SpeculatorContract
from hetero_core.testing.structured_output import StructuredOutputBackendContract
from hetero_core.testing.tokenizer import TokenizerContract

__all__ = [
    "CacheAllocatorContract",
    "ExecutorContract",
    "SchedulerPolicyContract",
    "SpeculatorContract",
    "StructuredOutputBackendContract",
    "TokenizerContract",
]
