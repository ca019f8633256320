"""From the scheduler's plan to the executor's batch: one :class:`ScheduledSequence` per planned sequence.

What the request wants of its next token travels as data: a constrained
sample gets its allowed-token bitmask here (a row of the step's one
bitmask, whose rows are filled together; a sample with proposals gets a
row per position, and its proposals end before the first its grammar
forbids). A sequence that cannot run
(its allocator's block table does not hold the step's tokens, or its
grammar engine cannot say what it may take) is left out and reported, so
it fails alone.
"""

from __future__ import annotations

from hetero_core.batch import ExecutionBatch, ScheduledSequence
from hetero_core.boundary import block_table_problem
from hetero_core.grammars import Grammars
from hetero_core.logs import get_logger
from hetero_core.scheduler import ScheduledWork, SchedulerOutput

log = get_logger(__name__)


class BatchBuilder:
    """Builds each step's :class:`ExecutionBatch` for one engine's pool."""

    def __init__(self, block_size: int, num_blocks: int, allocator_plugin: str, grammars: Grammars) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.allocator_plugin = allocator_plugin
        self.grammars = grammars

    def build(self, plan: SchedulerOutput) -> tuple[ExecutionBatch, dict[int, str]]:
        """The step's batch, and why any planned sequence was left out of it (by sequence id)."""
        sequences, problems, constrained = [], {}, []
        for work in plan.work:
            scheduled = scheduled_sequence(work)
            problem = block_table_problem(scheduled, self.block_size, self.num_blocks, self.allocator_plugin)
            if problem is not None:
                log.error("invalid block table", plugin=self.allocator_plugin, problem=problem)
                problems[work.seq.seq_id] = problem
                continue
            if scheduled.do_sample and work.seq.request.grammar is not None:
                if work.proposed:
                    problem = self._constrain_proposals(scheduled, work)
                    if problem is not None:
                        problems[work.seq.seq_id] = problem
                        continue
                else:
                    constrained.append((scheduled, work.seq))
            sequences.append(scheduled)
        if constrained:  # the step's masks, filled together
            bitmask, failed = self.grammars.allowed_tokens([seq for _, seq in constrained])
            for row, (scheduled, _) in enumerate(constrained):
                scheduled.allowed_tokens = bitmask[row]
            if failed:
                problems.update(failed)
                sequences = [s for s in sequences if s.seq_id not in failed]
        return ExecutionBatch(sequences, block_size=self.block_size), problems

    def _constrain_proposals(self, scheduled: ScheduledSequence, work: ScheduledWork) -> str | None:
        """Give a constrained sample with proposals a mask per position, cutting the proposals (in the batch and
        in ``work``) at the first its grammar forbids; why it cannot run, or None."""
        try:
            masks, kept = self.grammars.allowed_tokens_along(work.seq, work.proposed)
        except Exception as exc:  # the grammar engine's fault: this sample fails alone
            return self.grammars.failed(exc)
        cut = len(work.proposed) - kept
        if cut:
            work.proposed = work.proposed[:kept]
            work.num_new_tokens -= cut
            scheduled.token_ids = scheduled.token_ids[: len(scheduled.token_ids) - cut]
            scheduled.num_proposed = kept
        scheduled.allowed_tokens = masks if kept else masks[0]  # no proposal left: one row, as a plain sample
        return None


def scheduled_sequence(work: ScheduledWork) -> ScheduledSequence:
    """One planned sequence's share of the step, as the executor sees it."""
    seq = work.seq
    start = seq.num_computed_tokens
    num_own = work.num_new_tokens - len(work.proposed)
    return ScheduledSequence(
        seq_id=seq.seq_id,
        token_ids=seq.token_ids[start : start + num_own] + work.proposed,
        start_position=start,
        block_table=work.block_table,
        do_sample=work.do_sample and seq.request.params.max_tokens > 0,  # max_tokens 0 only scores the prompt
        params=seq.request.params,
        all_token_ids=seq.token_ids,
        num_prompt_tokens=seq.num_prompt_tokens,
        seed=seq.sampling_seed,
        num_proposed=len(work.proposed),
    )
