"""Contract tests for cache allocators.

Subclass :class:`CacheAllocatorContract` and override ``make_allocator``::

    class TestMyAllocator(CacheAllocatorContract):
        def make_allocator(self, num_blocks, block_size):
            return MyAllocator(num_blocks, block_size)
"""

from __future__ import annotations

import pytest

from hetero_core.errors import EngineError
from hetero_core.memory import MemoryStats
from hetero_core.protocols import CacheAllocator


def assert_accounting(stats: MemoryStats) -> None:
    assert stats.used_blocks + stats.free_blocks + stats.cached_blocks == stats.total_blocks
    assert min(stats.used_blocks, stats.free_blocks, stats.cached_blocks) >= 0


class CacheAllocatorContract:
    """What every cache allocator must do (see :class:`hetero_core.protocols.CacheAllocator`)."""

    def make_allocator(self, num_blocks: int, block_size: int) -> CacheAllocator:
        raise NotImplementedError("override make_allocator(num_blocks, block_size)")

    def test_sizes(self) -> None:
        allocator = self.make_allocator(8, 4)
        assert (allocator.num_blocks, allocator.block_size) == (8, 4)
        stats = allocator.stats()
        assert (stats.total_blocks, stats.free_blocks + stats.cached_blocks, stats.used_blocks) == (8, 8, 0)

    def test_append_grows_the_table_to_cover_the_tokens(self) -> None:
        allocator = self.make_allocator(8, 4)
        tokens = list(range(10))
        assert allocator.allocate(0, tokens) == 0
        assert allocator.can_append(0, 0, 10)
        assert allocator.append_slots(0, tokens, 0, 10) == []
        table = allocator.block_table(0)
        assert len(table) == 3 and len(set(table)) == 3
        assert all(0 <= b < 8 for b in table)
        tokens.append(10)
        allocator.append_slots(0, tokens, 10, 1)
        assert len(allocator.block_table(0)) == 3  # position 10 still fits block 2
        assert allocator.stats().used_blocks == 3
        assert_accounting(allocator.stats())

    def test_sequences_never_share_private_blocks(self) -> None:
        allocator = self.make_allocator(10, 2)
        for seq in range(3):
            tokens = [seq * 10 + i for i in range(5)]
            allocator.allocate(seq, tokens)
            allocator.append_slots(seq, tokens, 0, 5)
        blocks = [b for seq in range(3) for b in allocator.block_table(seq)]
        assert len(blocks) == len(set(blocks)) == 9

    def test_can_append_refuses_beyond_the_pool_and_append_raises(self) -> None:
        allocator = self.make_allocator(2, 4)
        tokens = list(range(12))
        allocator.allocate(0, tokens)
        assert not allocator.can_append(0, 0, 12)
        with pytest.raises(EngineError):
            allocator.append_slots(0, tokens, 0, 12)
        assert allocator.stats().used_blocks == 0
        assert allocator.can_append(0, 0, 8)

    def test_fork_shares_and_first_write_copies(self) -> None:
        allocator = self.make_allocator(8, 4)
        tokens = list(range(6))
        allocator.allocate(0, tokens)
        allocator.append_slots(0, tokens, 0, 6)
        allocator.fork(0, 1)
        assert allocator.block_table(1) == allocator.block_table(0)
        assert allocator.stats().used_blocks == 2
        child = tokens + [99]
        copies = allocator.append_slots(1, child, 6, 1)  # writes position 6, in the shared block 1
        parent_table, child_table = allocator.block_table(0), allocator.block_table(1)
        assert [(c.src, c.dst) for c in copies] == [(parent_table[1], child_table[1])]
        assert child_table[0] == parent_table[0] and child_table[1] != parent_table[1]
        assert allocator.append_slots(0, tokens + [5], 6, 1) == []  # the parent owns its block alone now
        assert_accounting(allocator.stats())

    def test_free_returns_every_block(self) -> None:
        allocator = self.make_allocator(8, 4)
        tokens = list(range(9))
        allocator.allocate(0, tokens)
        allocator.append_slots(0, tokens, 0, 9)
        allocator.fork(0, 1)
        allocator.free(0)
        assert allocator.stats().used_blocks == 3
        allocator.free(1)
        stats = allocator.stats()
        assert stats.used_blocks == 0 and stats.num_sequences == 0
        assert_accounting(stats)

    def test_cached_prefix_is_block_aligned_and_leaves_the_last_token(self) -> None:
        allocator = self.make_allocator(16, 4)
        tokens = list(range(8))
        allocator.allocate(0, tokens)
        allocator.append_slots(0, tokens, 0, 8)
        allocator.append_slots(0, tokens + [8], 8, 1)  # the prompt is computed now
        for length in (1, 4, 5, 8, 9):
            cached = allocator.allocate(100 + length, tokens[:length] if length <= 8 else tokens + [8])
            assert cached % 4 == 0 and cached < length
            allocator.free(100 + length)
        assert_accounting(allocator.stats())
