"""Continuous batching under budgets: which sequences run this step, and how many tokens each.

Each step admits, in this order and while the budgets last: running
sequences that decode (one token each), running sequences still computing
their prompt (a chunk each), then waiting sequences in the policy's order.
The budgets are ``max_batch_size`` sequences and ``max_total_tokens``
tokens per step, and ``max_num_seqs`` sequences holding KV at once. New
sequences are admitted only while block usage is at or below
``memory_threshold`` and no preemption happened in the step. When a
running sequence cannot get a block, the policy's victim (never one
already scheduled in this step) gives up its blocks and returns to the
waiting queue, to be recomputed later.

A request with ``n > 1`` has ``n`` sibling sequences. The first computes
the prompt's full blocks (all but the block of the last token) while the
others are held; then the others are placed, sharing those blocks
(``CacheAllocator.allocate`` with ``sibling_of``, whether or not prefix
caching is on), and each sibling computes the prompt's last block itself
and samples independently. No block is ever written while shared.

A request that asks for prompt logprobs takes nothing from the prefix
cache, so every prompt position is computed and scored.

A decoding sequence may come with a speculator's proposals: it then
computes its next token and the proposals in one step. They are cut to the
step's token budget and dropped when their slots would need a preemption.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Mapping

import attrs

from hetero_core.config import EngineConfig
from hetero_core.errors import SchedulerError
from hetero_core.protocols import CacheAllocator, SchedulerPolicy
from hetero_core.sequence import RequestState, Sequence
from hetero_core.sequence_view import SequenceView, sequence_of


@attrs.define
class ScheduledWork:
    """One sequence's share of a step: compute ``num_new_tokens`` tokens from ``seq.num_computed_tokens``."""

    seq: Sequence
    num_new_tokens: int  # proposals included
    do_sample: bool
    block_table: list[int]  # the sequence's physical blocks after this step's allocation
    proposed: list[int] = attrs.field(factory=list)  # a speculator's tokens to verify, after the sequence's own


@attrs.define
class SchedulerOutput:
    """The plan for one step."""

    work: list[ScheduledWork] = attrs.field(factory=list)
    preempted: list[Sequence] = attrs.field(factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0


class Scheduler:
    """Owns the waiting and running sequences and decides each step's batch."""

    def __init__(
        self,
        config: EngineConfig,
        policy: SchedulerPolicy,
        allocator: CacheAllocator,
        seq_ids: Iterator[int] | None = None,
        *,
        policy_plugin: str = "unknown",
    ) -> None:
        self.config = config
        self.policy = policy
        self.policy_plugin = policy_plugin
        self.wants_prefix_match = bool(getattr(policy, "wants_prefix_match", False))
        self.allocator = allocator
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self._seq_ids = seq_ids if seq_ids is not None else itertools.count()
        self.block_size = config.block_size

    def new_seq_id(self) -> int:
        return next(self._seq_ids)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def num_reserved_seqs(self) -> int:
        """Sequences holding KV now, plus the samples their requests still hold."""
        return sum(1 + len(s.request.held_samples) for s in self.running)

    def prefill_target(self, seq: Sequence) -> int:
        """How many tokens the sequence computes before it samples (or its held siblings are placed)."""
        if seq.request.held_samples:
            return (seq.num_prompt_tokens - 1) // self.block_size * self.block_size
        return seq.num_tokens

    def is_decoding(self, seq: Sequence) -> bool:
        """Whether the running ``seq`` computes one token and samples the next (it may take proposals)."""
        return self.prefill_target(seq) - seq.num_computed_tokens == 1 and seq.num_output_tokens > 0

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of scheduling (finished, aborted or failed) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
            self.allocator.free(seq.seq_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    # ------------------------------------------------------------------ the step plan

    def schedule(self, proposals: Mapping[int, list[int]] | None = None) -> SchedulerOutput:
        """The step's plan; ``proposals`` are tokens to verify after decoding sequences' next ones, by seq_id."""
        proposals = proposals or {}
        out = SchedulerOutput()
        token_budget = self.config.max_total_tokens
        seq_budget = self.config.max_batch_size
        scheduled: set[int] = set()

        decodes = [s for s in self.running if self.is_decoding(s)]
        decode_ids = {s.seq_id for s in decodes}
        prefills = [s for s in self.running if s.seq_id not in decode_ids]
        for seq in itertools.chain(self._order(decodes), self._order(prefills)):
            if seq_budget == 0 or token_budget == 0:
                break
            if seq not in self.running:  # preempted earlier in this step
                continue
            num_new = min(self.prefill_target(seq) - seq.num_computed_tokens, token_budget)
            proposed = proposals.get(seq.seq_id, [])[: token_budget - num_new]
            if proposed and not self.allocator.can_append(seq.seq_id, seq.num_computed_tokens, num_new + len(proposed)):
                proposed = []  # proposals never preempt anyone
            if not self._make_room(seq, num_new, scheduled, out):
                continue
            num_new += len(proposed)
            self._schedule(seq, num_new, out, proposed)
            scheduled.add(seq.seq_id)
            token_budget -= num_new
            seq_budget -= 1

        if not out.preempted:
            self._admit_waiting(out, token_budget, seq_budget)
        return out

    def _make_room(self, seq: Sequence, num_new: int, scheduled: set[int], out: SchedulerOutput) -> bool:
        """Preempt until ``seq`` can grow by ``num_new`` tokens; False if ``seq`` itself was preempted."""
        while not self.allocator.can_append(seq.seq_id, seq.num_computed_tokens, num_new):
            candidates = [s for s in self.running if s.seq_id not in scheduled]
            victim = self._victim(candidates)
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _order(self, seqs: list[Sequence], *, waiting: bool = False) -> list[Sequence]:
        """The policy's order, checked to be a permutation of ``seqs``."""
        if waiting and self.wants_prefix_match:
            match = self.allocator.num_cached_prefix_tokens
            views = [SequenceView(s, match(s.token_ids)) for s in seqs]
        else:
            views = [SequenceView(s) for s in seqs]
        ordered = self.policy.order(views)
        if (
            not isinstance(ordered, list)
            or len(ordered) != len(views)
            or {id(v) for v in ordered} != {id(v) for v in views}
        ):
            got = type(ordered).__name__ if not isinstance(ordered, list) else f"{len(ordered)} items"
            raise SchedulerError(
                f"scheduler policy plugin {self.policy_plugin!r}: order must return a permutation of the"
                f" {len(seqs)} sequences it was given (each once), got {got}"
            )
        return [sequence_of(v) for v in ordered]

    def _victim(self, candidates: list[Sequence]) -> Sequence:
        """The policy's preemption victim, checked to be one of ``candidates``."""
        if not candidates:
            raise SchedulerError("the cache cannot grow and no running sequence can be preempted")
        views = [SequenceView(s) for s in candidates]
        victim = self.policy.choose_victim(views)
        if not any(victim is v for v in views):
            raise SchedulerError(
                f"scheduler policy plugin {self.policy_plugin!r}: choose_victim must return one of the"
                f" {len(candidates)} running sequences it was given, got {victim!r:.100}"
            )
        return sequence_of(victim)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.allocator.free(seq.seq_id)
        seq.preempt()
        self.waiting.append(seq)
        out.preempted.append(seq)

    def _schedule(self, seq: Sequence, num_new: int, out: SchedulerOutput, proposed: list[int] | None = None) -> None:
        proposed = proposed or []
        token_ids = seq.token_ids + proposed if proposed else seq.token_ids
        self.allocator.append_slots(seq.seq_id, token_ids, seq.num_computed_tokens, num_new)
        do_sample = seq.num_computed_tokens + num_new - len(proposed) == seq.num_tokens
        out.work.append(ScheduledWork(seq, num_new, do_sample, self.allocator.block_table(seq.seq_id), proposed))
        if seq.state is RequestState.DECODE and do_sample and num_new == 1 + len(proposed):
            out.num_decode_tokens += num_new
        else:
            out.num_prefill_tokens += num_new

    def _admit_waiting(self, out: SchedulerOutput, token_budget: int, seq_budget: int) -> None:
        if not self.waiting or seq_budget == 0 or token_budget == 0:
            return
        admitted: set[int] = set()
        for seq in self._order(self.waiting, waiting=True):
            if seq_budget == 0 or token_budget == 0:
                break
            if self.num_reserved_seqs + 1 + len(seq.request.held_samples) > self.config.max_num_seqs:
                break
            if self.allocator.stats().usage > self.config.memory_threshold:
                break
            # A request that scores its prompt must compute every position: offered only its first token, the
            # allocator finds nothing in the prefix cache (it never covers the last token it is offered).
            known = seq.token_ids if seq.request.params.prompt_logprobs is None else seq.token_ids[:1]
            num_cached = self.allocator.allocate(seq.seq_id, known)
            target = self.prefill_target(seq)
            if seq.request.held_samples and num_cached == target:
                # The prompt's full blocks are cached already: place the siblings
                # now; every sample computes the last block from the next step on.
                self._start(seq, num_cached, admitted)
                self.place_siblings(seq)
                continue
            num_new = min(target - num_cached, token_budget)
            fits = self.config.enable_chunked_prefill or num_new == target - num_cached
            if not fits or not self.allocator.can_append(seq.seq_id, num_cached, num_new):
                self.allocator.free(seq.seq_id)
                break
            self._start(seq, num_cached, admitted)
            self._schedule(seq, num_new, out)
            token_budget -= num_new
            seq_budget -= 1
        if admitted:
            self.waiting = [s for s in self.waiting if s.seq_id not in admitted]

    def _start(self, seq: Sequence, num_cached: int, admitted: set[int]) -> None:
        self.running.append(seq)
        admitted.add(seq.seq_id)
        seq.admit(num_cached)

    # ------------------------------------------------------------------ parallel sampling

    def place_siblings(self, first: Sequence) -> None:
        """Once ``first`` has computed its prompt's full blocks, place its held siblings, sharing those blocks."""
        request = first.request
        if not request.held_samples or first.num_computed_tokens != self.prefill_target(first):
            return
        siblings, request.held_samples = request.held_samples, []
        for sibling in siblings:
            num_shared = self.allocator.allocate(sibling.seq_id, sibling.token_ids, sibling_of=first.seq_id)
            sibling.admit(num_shared)
            self.running.append(sibling)
