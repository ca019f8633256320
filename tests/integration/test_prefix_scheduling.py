"""Cache-aware scheduling end to end: ``lpm`` over the paged prefix cache and the mock executor."""

from __future__ import annotations

from hetero_core.params import GenerationParams

GROUPS, PER_GROUP, PREFIX, SUFFIX = 3, 6, 32, 4


def shared_prefix_prompts() -> list[list[int]]:
    """Three groups of requests sharing a 32-token system prompt, arriving interleaved (A, B, C, A, ...)."""
    return [[10 + i % GROUPS] * PREFIX + [100 + i] * SUFFIX for i in range(GROUPS * PER_GROUP)]


def run(make_engine, scheduler: str) -> tuple[float, list[list[int]]]:
    # 24 blocks of 4 tokens: two running requests (10 blocks each) leave room to cache one prefix, not three
    engine = make_engine(scheduler=scheduler, max_num_blocks=24, max_num_seqs=2, max_total_tokens=64)
    records = engine.generate(shared_prefix_prompts(), GenerationParams(max_tokens=4, temperature=0))
    assert engine.get_memory_stats().used_blocks == 0
    metrics = engine.metrics
    return metrics.prefix_cache_hits / metrics.prefix_cache_queries, [r.generated_tokens for r in records]


def test_lpm_groups_shared_prefixes_and_changes_no_output(make_engine) -> None:
    fcfs_hit_rate, fcfs_outputs = run(make_engine, "fcfs")
    lpm_hit_rate, lpm_outputs = run(make_engine, "lpm")
    # every request but the first of each group can find its group's prefix (all but the block of the last token)
    best = (GROUPS * (PER_GROUP - 1) * PREFIX) / (GROUPS * PER_GROUP * (PREFIX + SUFFIX))
    assert lpm_hit_rate == best
    assert fcfs_hit_rate < 0.6 * best  # interleaved arrivals evict each other's prefixes
    assert lpm_outputs == fcfs_outputs


def test_a_policy_that_does_not_ask_gets_no_prefix_lookups(make_engine) -> None:
    engine = make_engine(scheduler="fcfs")
    calls = []
    lookup = engine.allocator.num_cached_prefix_tokens
    engine.allocator.num_cached_prefix_tokens = lambda token_ids: calls.append(1) or lookup(token_ids)
    engine.generate([[1, 2, 3, 4, 5]] * 3, GenerationParams(max_tokens=2))
    assert not calls
    assert not engine.scheduler.wants_prefix_match
