"""The paged allocator: the core contract, prefix caching, eviction order, sibling sharing, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetero_cache_paged.allocator as allocator_module
from hetero_cache_paged import PagedAllocator
from hetero_cache_paged.plugin import PagedOptions, register_cache_allocators
from hetero_core.errors import CacheMemoryError, ConfigError, SchedulerError
from hetero_core.testing.cache_allocator import CacheAllocatorContract, compute_prompt


class TestPagedContract(CacheAllocatorContract):
    def make_allocator(self, num_blocks, block_size):
        return PagedAllocator(num_blocks, block_size)


class TestPagedWithoutPrefixCachingContract(CacheAllocatorContract):
    def make_allocator(self, num_blocks, block_size):
        return PagedAllocator(num_blocks, block_size, enable_prefix_caching=False)


def test_registered_as_paged() -> None:
    registered = {}
    register_cache_allocators(lambda name, factory, options=None: registered.setdefault(name, (factory, options)))
    assert registered == {"paged": (PagedAllocator, PagedOptions)}


def test_a_second_prompt_hits_the_shared_prefix() -> None:
    allocator = PagedAllocator(16, 4)
    compute_prompt(allocator, 0, list(range(10)))
    assert allocator.allocate(1, [*range(8), 50, 51]) == 8
    assert allocator.block_table(1) == allocator.block_table(0)[:2]
    assert allocator.refcount(allocator.block_table(0)[0]) == 2
    stats = allocator.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (10 + 10, 8)


def test_blocks_are_registered_only_once_computed() -> None:
    allocator = PagedAllocator(16, 2)
    tokens = [1, 2, 3, 4]
    allocator.allocate(0, tokens)
    allocator.append_slots(0, tokens, 0, 4)  # slots handed out, nothing computed yet
    assert allocator.allocate(1, [*tokens, 5]) == 0
    allocator.append_slots(0, [*tokens, 5], 4, 1)  # now the first four tokens are computed
    assert allocator.allocate(2, [*tokens, 5]) == 4


def test_freed_blocks_stay_cached_and_are_hit_again() -> None:
    allocator = PagedAllocator(4, 2)
    compute_prompt(allocator, 0, [1, 2, 3, 4, 5])
    allocator.free(0)
    stats = allocator.stats()
    assert (stats.used_blocks, stats.cached_blocks, stats.free_blocks) == (0, 2, 2)
    assert allocator.allocate(1, [1, 2, 3, 4, 9]) == 4
    assert all(allocator.refcount(block) == 1 and not allocator.is_cached(block) for block in allocator.block_table(1))
    assert allocator.stats().cached_blocks == 0


def test_least_recently_used_cached_block_is_evicted_first() -> None:
    allocator = PagedAllocator(4, 2)
    compute_prompt(allocator, 0, [1, 1, 7])
    compute_prompt(allocator, 1, [2, 2, 7])
    allocator.free(0)  # [1, 1] is cached first, so it is the older
    allocator.free(1)
    filler = [9] * 6
    allocator.allocate(2, filler)
    allocator.append_slots(2, filler, 0, 5)  # 3 blocks: the 2 free ones, then evicts the oldest cached
    allocator.free(2)
    assert allocator.allocate(3, [1, 1, 7]) == 0
    assert allocator.allocate(4, [2, 2, 7]) == 2


def test_a_hash_collision_never_returns_a_mismatching_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator_module, "block_hash", lambda parent_key, tokens: 42)
    allocator = PagedAllocator(8, 2)
    compute_prompt(allocator, 0, [1, 2, 3])
    assert allocator.allocate(1, [5, 6, 7]) == 0
    assert allocator.allocate(2, [1, 2, 9]) == 2


def test_equal_tokens_after_a_different_prefix_are_not_a_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator_module, "block_hash", lambda parent_key, tokens: hash(tokens))
    allocator = PagedAllocator(16, 2)
    compute_prompt(allocator, 0, [1, 1, 1, 1, 1])
    assert allocator.allocate(1, [1, 1, 1, 1, 1]) == 2  # block 0 only: the key of block 1 finds block 0
    compute_prompt(allocator, 2, [7, 8, 3, 4, 0])
    assert allocator.allocate(3, [9, 9, 3, 4, 0]) == 0  # [3, 4] is cached, but after [7, 8]


def test_a_colliding_block_does_not_lend_its_prefix_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator_module, "block_hash", lambda parent_key, tokens: hash(tokens))
    allocator = PagedAllocator(16, 2)
    compute_prompt(allocator, 0, [1, 2, 3, 4, 0])
    compute_prompt(allocator, 1, [5, 6, 3, 4, 7, 8, 0])  # [3, 4] collides with sequence 0's; [7, 8] follows it
    assert allocator.allocate(2, [1, 2, 3, 4, 7, 8, 0]) == 4  # [7, 8] was computed after [5, 6], not [1, 2]


def test_hashing_resumes_where_it_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    hashed = []

    def recording_hash(parent_key: int, tokens: tuple[int, ...]) -> int:
        hashed.append(tokens)
        return hash((parent_key, tokens))

    monkeypatch.setattr(allocator_module, "block_hash", recording_hash)
    allocator = PagedAllocator(16, 2)
    tokens = [1, 2, 3]
    allocator.allocate(0, tokens)
    hashed.clear()  # the lookup of the prompt's first block
    allocator.append_slots(0, tokens, 0, 3)
    for step in range(9):  # decode: one token per step
        tokens.append(10 + step)
        allocator.append_slots(0, tokens, len(tokens) - 1, 1)
    assert hashed == [tuple(tokens[i : i + 2]) for i in range(0, 10, 2)]


def test_prefix_caching_off_never_hits_or_caches() -> None:
    allocator = PagedAllocator(8, 2, enable_prefix_caching=False)
    compute_prompt(allocator, 0, [1, 2, 3])
    allocator.free(0)
    assert allocator.allocate(1, [1, 2, 3]) == 0
    stats = allocator.stats()
    assert (stats.cached_blocks, stats.free_blocks, stats.prefix_cache_queries) == (0, 8, 0)


def test_a_prompt_cached_whole_still_recomputes_its_last_token() -> None:
    allocator = PagedAllocator(8, 2)
    compute_prompt(allocator, 0, [1, 2, 3, 4])
    assert allocator.allocate(1, [1, 2, 3, 4]) == 2


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_siblings_share_the_prompt_blocks_counted_not_cached(enable_prefix_caching: bool) -> None:
    allocator = PagedAllocator(8, 4, enable_prefix_caching)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    allocator.allocate(0, tokens)
    allocator.append_slots(0, tokens, 0, 8)
    queries = allocator.stats().prefix_cache_queries
    for sibling in (1, 2):
        assert allocator.allocate(sibling, tokens, sibling_of=0) == 8
    assert [allocator.refcount(block) for block in allocator.block_table(0)] == [3, 3]
    assert allocator.stats().prefix_cache_queries == queries  # sharing with a sibling is not a prefix-cache lookup
    for seq_id in (0, 1, 2):
        allocator.append_slots(seq_id, tokens, 8, 2)
    assert allocator.stats().used_blocks == 2 + 3
    for seq_id in (0, 1, 2):
        allocator.free(seq_id)
    assert allocator.stats().cached_blocks == (2 if enable_prefix_caching else 0)


def test_a_shared_block_is_never_written() -> None:
    allocator = PagedAllocator(8, 4)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    allocator.allocate(0, tokens)
    allocator.append_slots(0, tokens, 0, 8)
    allocator.allocate(1, tokens, sibling_of=0)
    with pytest.raises(
        SchedulerError, match="sequence 1 would write position 6 into block .*, which 2 sequences share"
    ):
        allocator.append_slots(1, tokens, 6, 3)


def test_reset_prefix_cache_frees_cached_blocks_only() -> None:
    allocator = PagedAllocator(8, 2)
    compute_prompt(allocator, 0, [1, 2, 3, 4, 5])
    compute_prompt(allocator, 1, [6, 7, 8])
    allocator.free(0)
    allocator.reset_prefix_cache()
    stats = allocator.stats()
    assert (stats.used_blocks, stats.cached_blocks, stats.free_blocks) == (2, 0, 6)
    assert allocator.allocate(2, [1, 2, 3, 4, 5]) == 0
    assert allocator.allocate(3, [6, 7, 9]) == 2  # a live sequence's blocks stay registered


def test_misuse_names_the_sequence() -> None:
    allocator = PagedAllocator(4, 2)
    allocator.allocate(0, [1, 2, 3])
    with pytest.raises(SchedulerError, match="sequence 5"):
        allocator.append_slots(5, [1], 0, 1)
    with pytest.raises(SchedulerError, match="sequence 5"):
        allocator.free(5)
    with pytest.raises(SchedulerError, match="sequence 0 already"):
        allocator.allocate(0, [1])
    with pytest.raises(SchedulerError, match="sequence 5 has no"):
        allocator.allocate(6, [1, 2, 3], sibling_of=5)
    with pytest.raises(
        SchedulerError, match="sequence 0 holds 0 blocks, fewer than the 1 full prompt blocks sequence 7"
    ):
        allocator.allocate(7, [1, 2, 3], sibling_of=0)
    with pytest.raises(SchedulerError, match="num_computed_tokens=2"):
        allocator.can_append(0, 2, 1)  # nothing of sequence 0 is in the cache yet
    with pytest.raises(SchedulerError, match="token_ids has 1"):
        allocator.append_slots(0, [1], 0, 3)


@pytest.mark.parametrize(
    "arguments, field",
    [((0, 4), "num_blocks"), ((4, 0), "block_size"), ((4, 2, "no"), "enable_prefix_caching")],
)
def test_bad_options_name_the_field(arguments: tuple, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        PagedAllocator(*arguments)


def test_running_out_of_blocks_is_a_memory_error() -> None:
    allocator = PagedAllocator(1, 2)
    allocator.allocate(0, [1, 2, 3])
    with pytest.raises(CacheMemoryError, match="needs 2 more KV blocks, 1 are available"):
        allocator.append_slots(0, [1, 2, 3], 0, 3)


@settings(max_examples=60, deadline=None)
@given(
    num_blocks=st.integers(1, 6),
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=5),
    num_siblings=st.integers(0, 2),
    num_cached_prompts=st.integers(0, 2),
)
def test_can_append_is_exact(num_blocks: int, sizes: list[int], num_siblings: int, num_cached_prompts: int) -> None:
    allocator = PagedAllocator(num_blocks + 1 + 2 * num_cached_prompts, 2)
    for seq_id in range(100, 100 + num_cached_prompts):  # cached blocks that eviction may reclaim
        compute_prompt(allocator, seq_id, [seq_id, seq_id, 0])
        allocator.free(seq_id)
    allocator.allocate(0, [0, 0, 0])
    allocator.append_slots(0, [0, 0, 0], 0, 2)
    for sibling in range(1, num_siblings + 1):
        allocator.allocate(sibling, [0, 0, 0], sibling_of=0)
    done = 2
    for size in sizes:
        tokens = [0] * (done + size)
        can = allocator.can_append(0, done, size)
        before = (list(allocator.block_table(0)), allocator.stats())
        try:
            allocator.append_slots(0, tokens, done, size)
        except CacheMemoryError:
            assert not can
            assert (allocator.block_table(0), allocator.stats()) == before
        else:
            assert can
            done += size
