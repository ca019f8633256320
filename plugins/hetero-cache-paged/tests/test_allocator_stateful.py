"""Random allocate / append / sibling / free / fill sequences on tiny pools.

The core's workload checks contents and accounting through the protocol;
this one adds the paged allocator's own books: every block's reference
count equals the number of live tables holding it, and cached blocks are
ownerless. It runs with and without prefix caching, and with a hash that
collides on purpose.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis.stateful import invariant

import hetero_cache_paged.allocator as allocator_module
from hetero_cache_paged import PagedAllocator
from hetero_core.testing.cache_allocator import CacheAllocatorWorkload, run_workload


class PagedWorkload(CacheAllocatorWorkload):
    @invariant()
    def reference_counts_match_the_tables(self) -> None:
        if not hasattr(self, "allocator"):
            return
        allocator: PagedAllocator = self.allocator
        owners = Counter(block for seq_id in self.computed for block in allocator.block_table(seq_id))
        num_cached = 0
        for block in range(allocator.num_blocks):
            assert allocator.refcount(block) == owners[block] >= 0
            if allocator.is_cached(block):
                num_cached += 1
                assert owners[block] == 0
        stats = allocator.stats()
        assert stats.cached_blocks == num_cached
        assert stats.used_blocks == len(owners)
        if not allocator.enable_prefix_caching:
            assert num_cached == 0 and stats.prefix_cache_hits == 0


@pytest.mark.parametrize("enable_prefix_caching", [True, False], ids=["prefix-caching", "no-prefix-caching"])
def test_random_workloads_keep_the_books(enable_prefix_caching: bool) -> None:
    run_workload(
        lambda num_blocks, block_size: PagedAllocator(num_blocks, block_size, enable_prefix_caching),
        PagedWorkload,
        max_examples=150 if enable_prefix_caching else 50,
        steps=40,
    )


def test_colliding_hashes_never_serve_foreign_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # The key ignores the prefix: equal blocks anywhere collide, and the allocator must tell them apart.
    monkeypatch.setattr(allocator_module, "block_hash", lambda parent_key, tokens: hash(tokens))
    run_workload(PagedAllocator, PagedWorkload, max_examples=100, steps=40)
