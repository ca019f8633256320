"""Contract tests any plugin can run against itself: subclass the class for your extension point."""

from hetero_core.testing.cache_allocator import CacheAllocatorContract
from hetero_core.testing.executor import ExecutorContract
from hetero_core.testing.scheduler_policy import SchedulerPolicyContract
from hetero_core.testing.structured_output import StructuredOutputBackendContract
from hetero_core.testing.tokenizer import TokenizerContract

__all__ = [
    "CacheAllocatorContract",
    "ExecutorContract",
    "SchedulerPolicyContract",
    "StructuredOutputBackendContract",
    "TokenizerContract",
]
