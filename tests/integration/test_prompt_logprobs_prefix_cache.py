"""Prompt logprobs and the paged allocator's prefix cache: a scored request computes its whole prompt again."""

from __future__ import annotations

from hetero_core.params import GenerationParams

from ..test_prompt_logprobs import PROMPT, scores


def test_a_cached_prefix_is_computed_again_to_be_scored(make_engine) -> None:
    engine = make_engine()
    engine.generate([PROMPT], GenerationParams(max_tokens=2))  # leaves the prompt's blocks in the prefix cache
    hits = engine.metrics.prefix_cache_hits
    first, second = engine.generate([PROMPT, PROMPT], GenerationParams(max_tokens=2, prompt_logprobs=0))
    assert engine.metrics.prefix_cache_hits == hits and first.num_cached_tokens == second.num_cached_tokens == 0
    assert scores(first) == scores(second) and len(second.prompt_logprobs) == len(second.input_tokens)
    assert (
        engine.generate([PROMPT], GenerationParams(max_tokens=2))[0].num_cached_tokens > 0
    )  # the cache still serves others
