"""hetero-infer's microkernel: contracts, hooks, plugin manager, engine, config."""

from hetero_core.batch import ExecutionBatch, ExecutionOutput, ScheduledSequence, TokenLogprobs
from hetero_core.config import ComponentSpec, EngineConfig, PluginsConfig
from hetero_core.engine import InferenceEngine  # last: it builds on everything above
from hetero_core.errors import (
    CacheMemoryError,
    ConfigError,
    EngineError,
    ErrorKind,
    ExecutionError,
    SchedulerError,
    ValidationError,
)
from hetero_core.hookspecs import hookimpl
from hetero_core.memory import MemoryStats
from hetero_core.metrics import EngineMetrics, StepStats
from hetero_core.outputs import CompletedRequest, SequenceOutput, StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.protocols import (
    CacheAllocator,
    Executor,
    IncrementalDetokenizer,
    ModelInfo,
    SchedulerPolicy,
    Tokenizer,
)
from hetero_core.sequence import FinishReason, Request, RequestState, Sequence

__all__ = [
    "CacheAllocator",
    "CacheMemoryError",
    "CompletedRequest",
    "ComponentSpec",
    "ConfigError",
    "EngineConfig",
    "EngineError",
    "EngineMetrics",
    "ErrorKind",
    "ExecutionBatch",
    "ExecutionError",
    "ExecutionOutput",
    "Executor",
    "FinishReason",
    "GenerationParams",
    "IncrementalDetokenizer",
    "InferenceEngine",
    "MemoryStats",
    "ModelInfo",
    "PluginsConfig",
    "Request",
    "RequestState",
    "ScheduledSequence",
    "SchedulerError",
    "SchedulerPolicy",
    "Sequence",
    "SequenceOutput",
    "StepStats",
    "StreamDelta",
    "TokenLogprobs",
    "Tokenizer",
    "ValidationError",
    "hookimpl",
]
