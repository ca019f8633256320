"""Running a step's batch on the executor so that a sequence it cannot handle fails alone.

The executor may report a sequence it cannot handle in
``ExecutionOutput.errors``; what it returns is checked at the boundary
(:mod:`hetero_core.boundary`). When ``execute`` raises instead, the batch is
retried ``max_retry_attempts`` times (a transient fault); if it still fails
and holds more than one sequence, each sequence runs alone, once, so only
the sequences that fail on their own fail. This costs extra passes only
after a failure. Reasons given to requests name the executor's plugin and
an error id; the exception's text goes to the log only.
"""

from __future__ import annotations

import uuid

from hetero_core.batch import ExecutionBatch, ExecutionOutput
from hetero_core.boundary import check_execution_output
from hetero_core.errors import ExecutionError
from hetero_core.logs import get_logger
from hetero_core.metrics import EngineMetrics
from hetero_core.protocols import Executor

log = get_logger(__name__)


class BatchRunner:
    """Executes batches for one engine: retries, isolation of a failing sequence, output checks."""

    def __init__(
        self, executor: Executor, plugin: str, vocab_size: int, max_retry_attempts: int, metrics: EngineMetrics
    ) -> None:
        self.executor = executor
        self.plugin = plugin
        self.vocab_size = vocab_size
        self.num_attempts = max_retry_attempts + 1
        self.metrics = metrics

    def run(self, batch: ExecutionBatch) -> tuple[ExecutionOutput, dict[int, str]]:
        """The batch's output, and why each sequence that got no usable output failed (seq_id -> reason)."""
        if not batch.sequences:
            return ExecutionOutput({}), {}
        error_id = uuid.uuid4().hex[:12]
        try:
            output = self._with_retries(batch, error_id)
            return output, check_execution_output(output, batch, self.vocab_size, self.plugin)
        except ExecutionError as error:
            if len(batch.sequences) == 1:
                return ExecutionOutput({}), {batch.sequences[0].seq_id: error.message}
            return self._each_alone(batch, error_id)

    def _with_retries(self, batch: ExecutionBatch, error_id: str) -> ExecutionOutput:
        for attempt in range(1, self.num_attempts + 1):
            try:
                return self.executor.execute(batch)
            except Exception as exc:  # any executor fault: retry, then isolate
                self._log_failure(exc, error_id, attempt=attempt, num_sequences=len(batch.sequences))
                if attempt < self.num_attempts:
                    self.metrics.num_execution_retries += 1
        raise ExecutionError(
            f"executor plugin {self.plugin!r} failed to run the batch {self.num_attempts} times"
            f" (error id {error_id}; details in the log)"
        )

    def _each_alone(self, batch: ExecutionBatch, error_id: str) -> tuple[ExecutionOutput, dict[int, str]]:
        merged, problems = ExecutionOutput({}), {}
        for seq in batch.sequences:
            alone = ExecutionBatch([seq], batch.block_size)
            try:
                output = self.executor.execute(alone)
                problems.update(check_execution_output(output, alone, self.vocab_size, self.plugin))
            except Exception as exc:  # this sequence fails even alone: it is the one at fault
                self._log_failure(exc, error_id, seq_id=seq.seq_id)
                problems[seq.seq_id] = (
                    f"executor plugin {self.plugin!r} failed to run this request, alone as in its batch"
                    f" (error id {error_id}; details in the log)"
                )
                continue
            merged.sampled_token_ids.update(output.sampled_token_ids)
            merged.logprobs.update(output.logprobs)
            merged.prompt_logprobs.update(output.prompt_logprobs)
            merged.num_accepted.update(output.num_accepted)
            merged.accepted_logprobs.update(output.accepted_logprobs)
        return merged, problems

    def _log_failure(self, exc: Exception, error_id: str, **fields: object) -> None:
        log.warning(
            "executor failed",
            plugin=self.plugin,
            error_id=error_id,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
            **fields,
        )
