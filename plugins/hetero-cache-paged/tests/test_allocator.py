"""The paged allocator: contract, prefix caching, eviction order, copy-on-write."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

import hetero_cache_paged.allocator as allocator_module
from hetero_cache_paged import PagedAllocator
from hetero_core.testing import CacheAllocatorContract


class TestPagedContract(CacheAllocatorContract):
    def make_allocator(self, num_blocks, block_size):
        return PagedAllocator(num_blocks, block_size)


class TestPagedWithoutPrefixCachingContract(CacheAllocatorContract):
    def make_allocator(self, num_blocks, block_size):
        return PagedAllocator(num_blocks, block_size, enable_prefix_caching=False)


def computed(allocator: PagedAllocator, seq: int, tokens: list[int]) -> int:
    """Allocate and compute a whole prompt (plus one step, so its blocks are hashed)."""
    cached = allocator.allocate(seq, tokens)
    allocator.append_slots(seq, tokens, cached, len(tokens) - cached)
    allocator.append_slots(seq, tokens + [0], len(tokens), 1)
    return cached


def test_a_second_prompt_hits_the_shared_prefix() -> None:
    allocator = PagedAllocator(16, 4)
    computed(allocator, 0, list(range(10)))
    assert allocator.allocate(1, list(range(8)) + [50, 51]) == 8
    assert allocator.block_table(1) == allocator.block_table(0)[:2]
    assert allocator.refcount(allocator.block_table(0)[0]) == 2
    stats = allocator.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (10 + 10, 8)


def test_freed_blocks_stay_cached_until_needed() -> None:
    allocator = PagedAllocator(4, 2)
    computed(allocator, 0, [1, 2, 3, 4, 5])
    allocator.free(0)
    assert allocator.stats().cached_blocks == 2
    assert allocator.allocate(1, [1, 2, 3, 4, 9]) == 4


def test_least_recently_used_cached_block_is_evicted_first() -> None:
    allocator = PagedAllocator(4, 2)
    computed(allocator, 0, [1, 1, 7])
    computed(allocator, 1, [2, 2, 7])
    allocator.free(0)  # [1, 1] is cached first, so it is older
    allocator.free(1)
    hog = [9] * 6
    allocator.allocate(2, hog)
    allocator.append_slots(2, hog, 0, 5)  # needs 3 blocks: 2 free + evict the oldest cached
    allocator.free(2)
    assert allocator.allocate(3, [1, 1, 7]) == 0
    assert allocator.allocate(4, [2, 2, 7]) == 2


def test_a_hash_collision_never_returns_foreign_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator_module, "block_hash", lambda parent, tokens: 42)
    allocator = PagedAllocator(8, 2)
    computed(allocator, 0, [1, 2, 3])
    assert allocator.allocate(1, [5, 6, 7]) == 0
    assert allocator.allocate(2, [1, 2, 9]) == 2


def test_prefix_caching_off_never_hits() -> None:
    allocator = PagedAllocator(8, 2, enable_prefix_caching=False)
    computed(allocator, 0, [1, 2, 3])
    allocator.free(0)
    assert allocator.allocate(1, [1, 2, 3]) == 0
    assert allocator.stats().cached_blocks == 0


def test_whole_prompt_cached_still_recomputes_its_last_token() -> None:
    allocator = PagedAllocator(8, 2)
    computed(allocator, 0, [1, 2, 3, 4])
    assert allocator.allocate(1, [1, 2, 3, 4]) == 2


@given(
    num_blocks=st.integers(1, 6),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    fork_first=st.booleans(),
)
def test_can_append_is_exact(num_blocks: int, sizes: list[int], fork_first: bool) -> None:
    allocator = PagedAllocator(num_blocks, 2)
    allocator.allocate(0, [0])
    allocator.append_slots(0, [0], 0, 1)
    if fork_first:
        allocator.fork(0, 1)
    done = 1
    for size in sizes:
        tokens = [0] * (done + size)
        can = allocator.can_append(0, done, size)
        try:
            allocator.append_slots(0, tokens, done, size)
            assert can
            done += size
        except Exception:
            assert not can
            assert len(allocator.block_table(0)) * 2 >= done
