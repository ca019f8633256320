"""Engine counters and per-step statistics."""

from __future__ import annotations

import attrs

from hetero_core.memory import MemoryStats
from hetero_core.sequence import FinishReason


@attrs.define
class StepStats:
    """What one engine step did; handed to ``on_step_finished`` observers."""

    step: int
    num_sequences: int  # scheduled in this step's batch
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preemptions: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    duration: float  # seconds, scheduling to postprocessing


@attrs.define
class EngineMetrics:
    """Cumulative counters since the engine started. Read them; the engine writes them."""

    requests_submitted: int = 0
    requests_finished: dict[FinishReason, int] = attrs.field(factory=lambda: {r: 0 for r in FinishReason})
    prompt_tokens: int = 0  # prompt tokens of submitted requests
    generation_tokens: int = 0  # tokens sampled
    num_steps: int = 0
    num_preemptions: int = 0
    num_execution_retries: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # ... and found there
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    speculative_verifications: int = 0  # sequence steps that verified a speculator's proposals
    speculative_proposed_tokens: int = 0
    speculative_accepted_tokens: int = 0

    @property
    def mean_accepted_length(self) -> float:
        """Proposals kept per verifying sequence step (0.0 before any)."""
        return (
            self.speculative_accepted_tokens / self.speculative_verifications if self.speculative_verifications else 0.0
        )

    def record_verification(self, num_proposed: int, num_accepted: int) -> None:
        self.speculative_verifications += 1
        self.speculative_proposed_tokens += num_proposed
        self.speculative_accepted_tokens += num_accepted

    def record_step(self, num_preemptions: int, num_running: int, num_waiting: int, cache: MemoryStats) -> None:
        """Count a finished step and take the gauges it left."""
        self.num_steps += 1
        self.num_preemptions += num_preemptions
        self.prefix_cache_queries = cache.prefix_cache_queries
        self.prefix_cache_hits = cache.prefix_cache_hits
        self.num_running = num_running
        self.num_waiting = num_waiting
        self.kv_cache_usage = cache.usage
