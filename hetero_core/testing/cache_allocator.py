"""Contract tests for cache allocators.

Subclass :class:`CacheAllocatorContract` in a test module and override
``make_allocator``; pytest then runs every check below against your
allocator (with ``pytest`` and ``hypothesis`` installed, nothing else)::

    class TestMyAllocator(CacheAllocatorContract):
        def make_allocator(self, num_blocks, block_size):
            return MyAllocator(num_blocks, block_size)

The checks follow :class:`hetero_core.protocols.CacheAllocator` and hold
with or without prefix caching. Besides the unit checks,
:class:`CacheAllocatorWorkload` drives random allocate / append / sibling /
free calls on tiny pools and replays every block table into a shadow
cache, so a block written while shared, or a prefix hit or a sibling's
block with foreign contents, is caught. Subclass it to add checks of
your allocator's internals (as an ``@invariant``).
"""

from __future__ import annotations

from typing import Callable

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hetero_core.errors import CacheMemoryError
from hetero_core.memory import MemoryStats
from hetero_core.protocols import CacheAllocator

MakeAllocator = Callable[[int, int], CacheAllocator]
ALPHABET = st.integers(0, 2)  # few token values, so prompts share prefixes and hit the cache
MAX_LIVE_SEQUENCES = 4  # few enough that the rules keep meeting the same sequences
FILLER_TOKEN = 7  # not in ALPHABET: filler never shares a prefix with the random prompts


def assert_accounting(stats: MemoryStats) -> None:
    assert stats.used_blocks + stats.free_blocks + stats.cached_blocks == stats.total_blocks
    assert min(stats.used_blocks, stats.free_blocks, stats.cached_blocks) >= 0
    assert 0 <= stats.prefix_cache_hits <= stats.prefix_cache_queries


def compute_prompt(allocator: CacheAllocator, seq_id: int, tokens: list[int]) -> int:
    """Allocate ``tokens``, compute them all and one more step (so any prefix cache registers them)."""
    num_cached = allocator.allocate(seq_id, tokens)
    allocator.append_slots(seq_id, tokens, num_cached, len(tokens) - num_cached)
    allocator.append_slots(seq_id, [*tokens, FILLER_TOKEN], len(tokens), 1)
    return num_cached


class CacheAllocatorWorkload(RuleBasedStateMachine):
    """Random calls on a tiny pool, checked against a shadow of every slot's contents.

    A slot's shadow content is the whole prefix up to and including the
    token written there (what its keys and values depend on), so a block
    reused at another position or after another prefix is told apart.
    As in an engine step, slots handed out by ``append_slots`` are written
    only at the next ``execute`` (or sibling or free), after any ``allocate`` in
    between: a prefix hit on a block whose tokens are not computed yet reads
    missing contents and fails.
    """

    def __init__(self, make_allocator: MakeAllocator) -> None:
        super().__init__()
        self.make_allocator = make_allocator

    @initialize(num_blocks=st.integers(2, 12), block_size=st.integers(1, 4))
    def build(self, num_blocks: int, block_size: int) -> None:
        self.allocator = self.make_allocator(num_blocks, block_size)
        self.size = block_size
        self.tokens: dict[int, list[int]] = {}  # live sequence -> its known tokens
        self.computed: dict[int, int] = {}  # live sequence -> tokens written to its blocks
        self.pending: dict[int, int] = {}  # live sequence -> tokens it has slots for, to be written
        self.slots: dict[tuple[int, int], tuple[int, ...]] = {}  # (block, offset) -> prefix held there
        self.next_seq_id = 0

    def new_seq_id(self) -> int:
        self.next_seq_id += 1
        return self.next_seq_id - 1

    def check_contents(self, seq_id: int) -> None:
        table, tokens = self.allocator.block_table(seq_id), self.tokens[seq_id]
        for position in range(self.computed[seq_id]):
            held = self.slots.get((table[position // self.size], position % self.size))
            assert held == tuple(tokens[: position + 1]), f"sequence {seq_id} reads foreign KV at {position}"

    def reserve(self, seq_id: int, num_new: int) -> bool:
        """``append_slots`` for ``num_new`` tokens; False when the pool is full."""
        allocator, start = self.allocator, self.computed[seq_id]
        table_before, stats_before = list(allocator.block_table(seq_id)), allocator.stats()
        can = allocator.can_append(seq_id, start, num_new)
        assert allocator.stats() == stats_before, "can_append changed the pool"
        try:
            allocator.append_slots(seq_id, self.tokens[seq_id], start, num_new)
        except CacheMemoryError:
            assert not can, "can_append said yes, append_slots ran out of blocks"
            assert allocator.block_table(seq_id) == table_before and allocator.stats() == stats_before
            return False
        assert can, "can_append said no, append_slots succeeded"
        table = allocator.block_table(seq_id)
        assert len(table) * self.size >= start + num_new
        written = {table[position // self.size] for position in range(start, start + num_new)}
        for other in self.computed:
            shared = written.intersection(allocator.block_table(other)) if other != seq_id else set()
            assert not shared, f"sequence {seq_id} writes blocks {shared} in place, shared with sequence {other}"
        self.pending[seq_id] = num_new
        return True

    def write_pending(self) -> None:
        """Compute the tokens of every reserved slot (the executor's part of a step)."""
        for seq_id, num_new in self.pending.items():
            table, tokens, start = self.allocator.block_table(seq_id), self.tokens[seq_id], self.computed[seq_id]
            for position in range(start, start + num_new):
                self.slots[(table[position // self.size], position % self.size)] = tuple(tokens[: position + 1])
            self.computed[seq_id] = start + num_new
        self.pending.clear()

    def end(self, seq_id: int) -> None:
        self.write_pending()
        self.allocator.free(seq_id)
        del self.computed[seq_id], self.tokens[seq_id]

    @precondition(lambda self: len(self.computed) < MAX_LIVE_SEQUENCES)
    @rule(tokens=st.lists(ALPHABET, min_size=1, max_size=12))
    def allocate(self, tokens: list[int]) -> None:
        seq_id = self.new_seq_id()
        stats_before = self.allocator.stats()
        predicted = self.allocator.num_cached_prefix_tokens(tokens)
        assert self.allocator.stats() == stats_before, "num_cached_prefix_tokens changed the pool or its counters"
        num_cached = self.allocator.allocate(seq_id, tokens)
        assert num_cached == predicted, f"num_cached_prefix_tokens said {predicted}, allocate found {num_cached}"
        assert num_cached % self.size == 0 and 0 <= num_cached < len(tokens)
        assert len(self.allocator.block_table(seq_id)) == num_cached // self.size
        self.tokens[seq_id], self.computed[seq_id] = list(tokens), num_cached
        self.check_contents(seq_id)

    @precondition(lambda self: self.computed)
    @rule(data=st.data(), num_new=st.integers(0, 6), extra=st.lists(ALPHABET, max_size=3))
    def append(self, data: st.DataObject, num_new: int, extra: list[int]) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.computed)))
        if seq_id in self.pending:  # one reservation per sequence and step
            self.write_pending()
        self.tokens[seq_id].extend(extra)
        self.reserve(seq_id, min(num_new, len(self.tokens[seq_id]) - self.computed[seq_id]))

    @precondition(lambda self: self.pending)
    @rule()
    def execute(self) -> None:
        self.write_pending()

    @precondition(lambda self: self.computed)
    @rule(
        data=st.data(),
        guesses=st.lists(ALPHABET, min_size=1, max_size=6),
        num_kept=st.integers(0, 6),
        next_token=ALPHABET,
    )
    def speculate(self, data: st.DataObject, guesses: list[int], num_kept: int, next_token: int) -> None:
        """A decode step with proposals: slots for the last token and the guesses, all written, then the table
        trimmed to the tokens kept (the rest of the guesses were wrong)."""
        self.write_pending()
        decoding = [s for s in sorted(self.computed) if self.computed[s] == len(self.tokens[s]) - 1]
        if not decoding:
            return
        seq_id = data.draw(st.sampled_from(decoding))
        tokens, start = self.tokens[seq_id], self.computed[seq_id]
        self.tokens[seq_id] = tokens + guesses
        if not self.reserve(seq_id, 1 + len(guesses)):
            self.tokens[seq_id] = tokens
            return
        self.write_pending()
        kept = min(num_kept, len(guesses))
        self.tokens[seq_id] = tokens + guesses[:kept] + [next_token]
        self.computed[seq_id] = start + 1 + kept
        self.allocator.trim(seq_id, self.computed[seq_id])
        assert len(self.allocator.block_table(seq_id)) == -(-self.computed[seq_id] // self.size)

    @precondition(lambda self: 0 < len(self.computed) < MAX_LIVE_SEQUENCES)
    @rule(data=st.data(), tail=st.lists(ALPHABET, min_size=1, max_size=4))
    def sibling(self, data: st.DataObject, tail: list[int]) -> None:
        """A sibling shares another sequence's computed full blocks, then computes a last block of its own."""
        self.write_pending()
        first = data.draw(st.sampled_from(sorted(self.computed)))
        num_full = self.computed[first] // self.size * self.size
        tokens = self.tokens[first][:num_full] + tail[: self.size]
        seq_id = self.new_seq_id()
        assert self.allocator.allocate(seq_id, tokens, sibling_of=first) == num_full
        assert self.allocator.block_table(seq_id) == self.allocator.block_table(first)[: num_full // self.size]
        self.tokens[seq_id], self.computed[seq_id] = tokens, num_full
        self.check_contents(seq_id)
        self.reserve(seq_id, len(tokens) - num_full)

    @precondition(lambda self: self.computed)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.end(data.draw(st.sampled_from(sorted(self.computed))))

    @rule()
    def fill_the_pool(self) -> None:
        """A long filler sequence takes every block it can get, forcing cached blocks out, then ends."""
        seq_id = self.new_seq_id()
        self.tokens[seq_id] = [FILLER_TOKEN] * (self.allocator.num_blocks * self.size)
        self.computed[seq_id] = self.allocator.allocate(seq_id, self.tokens[seq_id])
        for num_new in (self.size * 4, self.size, 1):
            while self.computed[seq_id] + num_new <= len(self.tokens[seq_id]) and self.reserve(seq_id, num_new):
                self.write_pending()
        self.books_balance()
        self.end(seq_id)

    @invariant()
    def books_balance(self) -> None:
        if not hasattr(self, "allocator"):
            return
        stats = self.allocator.stats()
        assert_accounting(stats)
        assert stats.num_sequences == len(self.computed)
        held: set[int] = set()
        for seq_id in self.computed:
            table = self.allocator.block_table(seq_id)
            assert all(0 <= block < self.allocator.num_blocks for block in table)
            assert len(set(table)) == len(table)
            held.update(table)
            self.check_contents(seq_id)
        assert stats.used_blocks == len(held)

    def teardown(self) -> None:
        if not hasattr(self, "allocator"):
            return
        for seq_id in list(self.computed):
            self.end(seq_id)
        stats = self.allocator.stats()
        assert stats.used_blocks == 0 and stats.num_sequences == 0
        assert_accounting(stats)
        # Every block can be had again: cached ones give way to a sequence that needs them.
        seq_id, everything = self.new_seq_id(), [FILLER_TOKEN] * (self.allocator.num_blocks * self.size)
        num_cached = self.allocator.allocate(seq_id, everything)
        assert self.allocator.can_append(seq_id, num_cached, len(everything) - num_cached)
        self.allocator.append_slots(seq_id, everything, num_cached, len(everything) - num_cached)
        assert sorted(self.allocator.block_table(seq_id)) == list(range(self.allocator.num_blocks))


def run_workload(
    make_allocator: MakeAllocator,
    workload: type[CacheAllocatorWorkload] = CacheAllocatorWorkload,
    *,
    max_examples: int = 100,
    steps: int = 30,
) -> None:
    """Run ``workload`` on allocators from ``make_allocator`` (a test's body)."""
    run_state_machine_as_test(
        lambda: workload(make_allocator),
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


class CacheAllocatorContract:
    """What every cache allocator must do (see :class:`hetero_core.protocols.CacheAllocator`)."""

    def make_allocator(self, num_blocks: int, block_size: int) -> CacheAllocator:
        raise NotImplementedError("override make_allocator(num_blocks, block_size)")

    def test_sizes_and_an_empty_pool(self) -> None:
        allocator = self.make_allocator(8, 4)
        assert (allocator.num_blocks, allocator.block_size) == (8, 4)
        stats = allocator.stats()
        assert (stats.total_blocks, stats.block_size, stats.used_blocks, stats.num_sequences) == (8, 4, 0, 0)
        assert_accounting(stats)

    def test_allocate_takes_no_block_without_a_hit(self) -> None:
        allocator = self.make_allocator(8, 4)
        assert allocator.allocate(0, list(range(10))) == 0
        assert allocator.block_table(0) == []
        assert allocator.stats().used_blocks == 0 and allocator.stats().num_sequences == 1

    def test_append_grows_the_table_to_cover_the_tokens(self) -> None:
        allocator = self.make_allocator(8, 4)
        tokens = list(range(10))
        allocator.allocate(0, tokens)
        assert allocator.can_append(0, 0, 10)
        allocator.append_slots(0, tokens, 0, 10)
        table = list(allocator.block_table(0))  # a copy: the allocator may change its own list
        assert len(table) == 3 and len(set(table)) == 3
        assert all(0 <= block < 8 for block in table)
        allocator.append_slots(0, [*tokens, 10], 10, 1)
        assert allocator.block_table(0) == table  # position 10 still fits block 2
        allocator.append_slots(0, [*tokens, 10, 11, 12], 11, 2)
        assert len(allocator.block_table(0)) == 4 and allocator.block_table(0)[:3] == table
        assert allocator.stats().used_blocks == 4
        assert_accounting(allocator.stats())

    def test_sequences_never_share_private_blocks(self) -> None:
        allocator = self.make_allocator(10, 2)
        for seq_id in range(3):
            tokens = [seq_id * 10 + i for i in range(5)]
            allocator.allocate(seq_id, tokens)
            allocator.append_slots(seq_id, tokens, 0, 5)
        blocks = [block for seq_id in range(3) for block in allocator.block_table(seq_id)]
        assert len(blocks) == len(set(blocks)) == 9

    def test_running_out_of_blocks_raises_and_changes_nothing(self) -> None:
        allocator = self.make_allocator(2, 4)
        tokens = list(range(12))
        allocator.allocate(0, tokens)
        allocator.append_slots(0, tokens, 0, 4)
        before = allocator.stats()
        assert not allocator.can_append(0, 4, 8)
        with pytest.raises(CacheMemoryError):
            allocator.append_slots(0, tokens, 4, 8)
        assert allocator.stats() == before and len(allocator.block_table(0)) == 1
        assert allocator.can_append(0, 4, 4)
        allocator.append_slots(0, tokens, 4, 4)
        assert allocator.stats().used_blocks == 2

    @pytest.mark.parametrize(("prompt_length", "num_shared"), [(9, 2), (10, 2), (12, 2), (13, 3), (4, 0)])
    def test_a_sibling_shares_the_prompt_blocks_before_the_last_token(
        self, prompt_length: int, num_shared: int
    ) -> None:
        allocator = self.make_allocator(16, 4)
        tokens = list(range(prompt_length))
        allocator.allocate(0, tokens)
        allocator.append_slots(0, tokens, 0, num_shared * 4)
        assert allocator.allocate(1, tokens, sibling_of=0) == num_shared * 4
        assert allocator.block_table(1) == allocator.block_table(0)
        assert allocator.stats().used_blocks == num_shared and allocator.stats().num_sequences == 2
        for seq_id in (0, 1):
            assert allocator.can_append(seq_id, num_shared * 4, prompt_length - num_shared * 4)
            allocator.append_slots(seq_id, tokens, num_shared * 4, prompt_length - num_shared * 4)
        first, sibling = allocator.block_table(0), allocator.block_table(1)
        assert first[:num_shared] == sibling[:num_shared] and first[num_shared] != sibling[num_shared]
        assert allocator.stats().used_blocks == num_shared + 2
        assert_accounting(allocator.stats())

    def test_trim_releases_the_blocks_past_the_tokens_kept(self) -> None:
        allocator = self.make_allocator(8, 4)
        tokens = list(range(14))
        allocator.allocate(0, tokens)
        allocator.append_slots(0, tokens, 0, 5)
        allocator.append_slots(0, tokens, 5, 9)  # 4 blocks: a step of one token and 8 proposals
        table = list(allocator.block_table(0))
        allocator.trim(0, 7)  # 2 of the proposals kept
        assert allocator.block_table(0) == table[:2]
        assert allocator.stats().used_blocks == 2
        allocator.trim(0, 8)  # the table fits already
        assert allocator.block_table(0) == table[:2]
        assert allocator.can_append(0, 7, 2)
        allocator.append_slots(0, tokens, 7, 2)
        assert allocator.block_table(0)[:2] == table[:2] and len(allocator.block_table(0)) == 3
        assert_accounting(allocator.stats())

    def test_free_returns_every_block(self) -> None:
        allocator = self.make_allocator(8, 4)
        tokens = list(range(9))
        allocator.allocate(0, tokens)
        allocator.append_slots(0, tokens, 0, 9)
        allocator.allocate(1, tokens, sibling_of=0)
        allocator.append_slots(1, tokens, 8, 1)
        allocator.free(0)
        assert allocator.stats().used_blocks == 3
        allocator.free(1)
        stats = allocator.stats()
        assert stats.used_blocks == 0 and stats.num_sequences == 0
        assert_accounting(stats)

    def test_cached_prefix_is_block_aligned_and_leaves_the_last_token(self) -> None:
        allocator = self.make_allocator(16, 4)
        tokens = list(range(8))
        compute_prompt(allocator, 0, tokens)
        for length in (1, 4, 5, 8, 9):
            prompt = tokens[:length] if length <= 8 else [*tokens, FILLER_TOKEN]
            num_cached = allocator.allocate(100 + length, prompt)
            assert num_cached % 4 == 0 and 0 <= num_cached < length
            table = allocator.block_table(100 + length)
            assert table == allocator.block_table(0)[: num_cached // 4]
            allocator.free(100 + length)
        assert_accounting(allocator.stats())

    def test_a_prefix_query_predicts_allocate_and_takes_nothing(self) -> None:
        allocator = self.make_allocator(16, 4)
        tokens = list(range(12))
        assert allocator.num_cached_prefix_tokens(tokens) == 0
        compute_prompt(allocator, 0, tokens)
        allocator.free(0)
        stats = allocator.stats()
        for prompt in (
            tokens,
            tokens[:9],
            tokens[:8],
            [*tokens[:4], FILLER_TOKEN, *tokens[5:]],
            [FILLER_TOKEN, *tokens],
        ):
            predicted = allocator.num_cached_prefix_tokens(prompt)
            assert predicted % 4 == 0 and 0 <= predicted < len(prompt)
            assert allocator.stats() == stats
            assert allocator.allocate(1, prompt) == predicted
            allocator.free(1)
            stats = allocator.stats()

    def test_cached_blocks_give_way_to_a_sequence_that_needs_them(self) -> None:
        allocator = self.make_allocator(4, 2)
        compute_prompt(allocator, 0, [1, 2, 3, 4, 5])
        allocator.free(0)
        assert allocator.stats().used_blocks == 0
        filler = [FILLER_TOKEN] * 8
        assert allocator.allocate(1, filler) == 0
        assert allocator.can_append(1, 0, 8)
        allocator.append_slots(1, filler, 0, 8)
        assert sorted(allocator.block_table(1)) == [0, 1, 2, 3]
        stats = allocator.stats()
        assert (stats.used_blocks, stats.free_blocks, stats.cached_blocks) == (4, 0, 0)

    def test_random_workload_keeps_the_books(self) -> None:
        run_workload(self.make_allocator)
