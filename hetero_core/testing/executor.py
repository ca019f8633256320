"""Contract tests for executors.

Subclass :class:`ExecutorContract` and override the ``executor`` fixture to
return an executor not yet given a cache; the checks size and initialise
the cache themselves, once, and every check of the class reuses it, so a
real model loads once per class (or once per module or session, with a
wider-scoped fixture behind it)::

    class TestMyExecutor(ExecutorContract):
        @pytest.fixture(scope="class")
        @classmethod
        def executor(cls):
            return MyExecutor(...)

Each check writes the blocks it reads, so the checks do not depend on one
another or on their order.
"""

from __future__ import annotations

import math
import random

import pytest

from hetero_core.batch import ExecutionBatch, ScheduledSequence
from hetero_core.params import GenerationParams
from hetero_core.protocols import Executor
from hetero_core.structured_output import new_bitmask

BLOCK_SIZE = 4
NUM_BLOCKS = 32
GREEDY = GenerationParams(temperature=0.0, max_tokens=8)


def scheduled(
    seq_id: int,
    tokens: list[int],
    start: int,
    count: int,
    block_table: list[int],
    *,
    params: GenerationParams = GREEDY,
    seed: int | None = None,
    allowed: list[int] | None = None,
) -> ScheduledSequence:
    """Compute ``tokens[start:start + count]``; sample when that reaches the end of ``tokens``."""
    return ScheduledSequence(
        seq_id=seq_id,
        token_ids=tokens[start : start + count],
        start_position=start,
        block_table=block_table,
        do_sample=start + count == len(tokens),
        params=params,
        all_token_ids=tokens,
        num_prompt_tokens=len(tokens),
        seed=seed,
        allowed_tokens=None if allowed is None else bitmask_row(allowed, vocab_size=max(allowed) + 1),
    )


def bitmask_row(allowed: list[int], *, vocab_size: int):
    """A structured-output bitmask row that allows exactly ``allowed``."""
    bitmask = new_bitmask(1, vocab_size)
    bitmask[:] = 0
    for token_id in allowed:
        bitmask[0, token_id // 32] |= 1 << (token_id % 32)
    return bitmask[0]


def prompt(executor: Executor, length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(min(executor.model_info.vocab_size, 200)) for _ in range(length)]


class ExecutorContract:
    """What every executor must do (see :class:`hetero_core.protocols.Executor`)."""

    @pytest.fixture(scope="class")
    @classmethod
    def executor(cls) -> Executor:
        raise NotImplementedError(
            "override the 'executor' fixture (scope 'class' or wider) to return an executor without a cache"
        )

    @pytest.fixture(scope="class")
    @classmethod
    def ready(cls, executor: Executor) -> Executor:
        executor.initialize_cache(NUM_BLOCKS, BLOCK_SIZE)
        executor.warm_up(16, 4)
        yield executor
        executor.close()

    def test_model_info(self, executor: Executor) -> None:
        info = executor.model_info
        assert info.vocab_size > 0 and info.max_model_len > 0 and info.name

    def test_block_bytes_positive(self, executor: Executor) -> None:
        assert executor.kv_cache_block_bytes(BLOCK_SIZE) > 0
        assert executor.kv_cache_block_bytes(2 * BLOCK_SIZE) >= executor.kv_cache_block_bytes(BLOCK_SIZE)

    def test_samples_exactly_the_sequences_that_ask(self, ready: Executor) -> None:
        tokens = prompt(ready, 10)
        batch = ExecutionBatch(
            [scheduled(0, tokens, 0, 6, [0, 1, 2]), scheduled(1, tokens, 0, 10, [3, 4, 5])], BLOCK_SIZE
        )
        out = ready.execute(batch)
        assert set(out.sampled_token_ids) == {1}
        assert 0 <= out.sampled_token_ids[1] < ready.model_info.vocab_size

    def test_chunked_prefill_equals_whole_prefill(self, ready: Executor) -> None:
        tokens = prompt(ready, 11, seed=1)
        whole = ready.execute(ExecutionBatch([scheduled(0, tokens, 0, 11, [0, 1, 2])], BLOCK_SIZE))
        table = [7, 3, 9]  # scattered physical blocks
        for start, count in ((0, 5), (5, 4), (9, 2)):
            chunked = ready.execute(ExecutionBatch([scheduled(1, tokens, start, count, table)], BLOCK_SIZE))
        assert chunked.sampled_token_ids[1] == whole.sampled_token_ids[0]

    def test_batch_composition_does_not_change_greedy_tokens(self, ready: Executor) -> None:
        a, b = prompt(ready, 9, seed=2), prompt(ready, 6, seed=3)
        alone = ready.execute(ExecutionBatch([scheduled(0, a, 0, 9, [0, 1, 2])], BLOCK_SIZE))
        together = ready.execute(
            ExecutionBatch([scheduled(1, b, 0, 6, [3, 4]), scheduled(2, a, 0, 9, [5, 6, 7])], BLOCK_SIZE)
        )
        assert together.sampled_token_ids[2] == alone.sampled_token_ids[0]

    def test_siblings_read_the_prompt_blocks_they_share(self, ready: Executor) -> None:
        tokens = prompt(ready, 10, seed=4)
        alone = ready.execute(ExecutionBatch([scheduled(0, tokens, 0, 10, [0, 1, 2])], BLOCK_SIZE))
        # Sequence 1 computes blocks 3 and 4; its siblings share them and each computes the last block itself.
        ready.execute(ExecutionBatch([scheduled(1, tokens, 0, 8, [3, 4])], BLOCK_SIZE))
        siblings = ready.execute(
            ExecutionBatch([scheduled(seq_id, tokens, 8, 2, [3, 4, 4 + seq_id]) for seq_id in (1, 2, 3)], BLOCK_SIZE)
        )
        assert [siblings.sampled_token_ids[seq_id] for seq_id in (1, 2, 3)] == [alone.sampled_token_ids[0]] * 3

    def test_seeded_sampling_reproduces(self, ready: Executor) -> None:
        tokens = prompt(ready, 7, seed=5)
        params = GenerationParams(temperature=1.0, top_p=1.0, seed=1234)
        first = ready.execute(
            ExecutionBatch([scheduled(0, tokens, 0, 7, [0, 1], params=params, seed=1234)], BLOCK_SIZE)
        )
        other = prompt(ready, 5, seed=6)
        again = ready.execute(
            ExecutionBatch(
                [scheduled(1, other, 0, 5, [2, 3]), scheduled(2, tokens, 0, 7, [4, 5], params=params, seed=1234)],
                BLOCK_SIZE,
            )
        )
        assert again.sampled_token_ids[2] == first.sampled_token_ids[0]

    def test_logprobs_when_asked(self, ready: Executor) -> None:
        tokens = prompt(ready, 5, seed=8)
        params = GenerationParams(temperature=0.0, logprobs=3)
        out = ready.execute(ExecutionBatch([scheduled(0, tokens, 0, 5, [0, 1], params=params)], BLOCK_SIZE))
        logprobs = out.logprobs[0]
        assert logprobs.token_id == out.sampled_token_ids[0]
        assert logprobs.logprob <= 0.0
        assert len(logprobs.top) == 3
        assert [lp for _, lp in logprobs.top] == sorted((lp for _, lp in logprobs.top), reverse=True)

    def test_a_tiny_temperature_is_greedy(self, ready: Executor) -> None:
        tokens = prompt(ready, 6, seed=9)
        greedy = ready.execute(ExecutionBatch([scheduled(0, tokens, 0, 6, [0, 1])], BLOCK_SIZE))
        tiny = GenerationParams(temperature=1e-38, top_p=1.0)
        out = ready.execute(ExecutionBatch([scheduled(1, tokens, 0, 6, [2, 3], params=tiny)], BLOCK_SIZE))
        assert out.sampled_token_ids[1] == greedy.sampled_token_ids[0]

    def test_logprobs_stay_finite_under_extreme_parameters(self, ready: Executor) -> None:
        tokens = prompt(ready, 6, seed=10)
        vocab_size = ready.model_info.vocab_size
        extreme = GenerationParams(
            temperature=2.0, repetition_penalty=0.01, frequency_penalty=2.0, min_tokens=8, logprobs=20
        )
        out = ready.execute(ExecutionBatch([scheduled(0, tokens, 0, 6, [0, 1], params=extreme)], BLOCK_SIZE))
        assert out.errors == {} and 0 <= out.sampled_token_ids[0] < vocab_size
        entry = out.logprobs[0]
        for logprob in [entry.logprob, *(lp for _, lp in entry.top)]:
            assert math.isfinite(logprob) and logprob <= 0.0

    def test_samples_vary_with_the_seed(self, ready: Executor) -> None:
        tokens = prompt(ready, 6, seed=11)
        params = GenerationParams(temperature=2.0, top_p=1.0)
        drawn = set()
        for seed in range(24):
            out = ready.execute(
                ExecutionBatch([scheduled(seed, tokens, 0, 6, [0, 1], params=params, seed=seed)], BLOCK_SIZE)
            )
            drawn.add(out.sampled_token_ids[seed])
        assert len(drawn) > 1, "24 seeds at temperature 2 all drew one token: the executor does not sample"

    @pytest.mark.parametrize(
        "params",
        [GREEDY, GenerationParams(temperature=1.5, top_p=1.0), GenerationParams(temperature=1.0, top_k=5, min_p=0.2)],
        ids=["greedy", "sampled", "truncated"],
    )
    def test_only_allowed_tokens_are_sampled(self, ready: Executor, params: GenerationParams) -> None:
        tokens = prompt(ready, 6, seed=12)
        vocab_size = ready.model_info.vocab_size
        allowed = sorted({7 % vocab_size, 101 % vocab_size, (vocab_size - 1)})
        for seed in range(8):
            out = ready.execute(
                ExecutionBatch(
                    [scheduled(seed, tokens, 0, 6, [0, 1], params=params, seed=seed, allowed=allowed)], BLOCK_SIZE
                )
            )
            assert out.sampled_token_ids[seed] in allowed

    def test_a_mask_applies_to_its_own_row_only(self, ready: Executor) -> None:
        a, b = prompt(ready, 6, seed=13), prompt(ready, 6, seed=14)
        free = ready.execute(ExecutionBatch([scheduled(0, b, 0, 6, [0, 1])], BLOCK_SIZE)).sampled_token_ids[0]
        only = (free + 1) % ready.model_info.vocab_size
        out = ready.execute(
            ExecutionBatch([scheduled(1, a, 0, 6, [2, 3], allowed=[only]), scheduled(2, b, 0, 6, [4, 5])], BLOCK_SIZE)
        )
        assert out.sampled_token_ids == {1: only, 2: free}

    def test_logit_bias_bans_and_forces_tokens(self, ready: Executor) -> None:
        tokens = prompt(ready, 6, seed=15)
        greedy = ready.execute(ExecutionBatch([scheduled(0, tokens, 0, 6, [0, 1])], BLOCK_SIZE)).sampled_token_ids[0]
        banned = GenerationParams(temperature=0.0, logit_bias={greedy: -100})
        out = ready.execute(ExecutionBatch([scheduled(1, tokens, 0, 6, [2, 3], params=banned)], BLOCK_SIZE))
        assert out.sampled_token_ids[1] != greedy
        forced_token = (greedy + 3) % ready.model_info.vocab_size
        forced = GenerationParams(temperature=0.7, top_p=1.0, logit_bias={forced_token: 100})
        out = ready.execute(ExecutionBatch([scheduled(2, tokens, 0, 6, [4, 5], params=forced, seed=1)], BLOCK_SIZE))
        assert out.sampled_token_ids[2] == forced_token

    def test_logprobs_under_a_mask_cover_only_allowed_tokens(self, ready: Executor) -> None:
        tokens = prompt(ready, 6, seed=16)
        allowed = [3, 5, 8]
        params = GenerationParams(temperature=0.0, logprobs=2)
        out = ready.execute(
            ExecutionBatch([scheduled(0, tokens, 0, 6, [0, 1], params=params, allowed=allowed)], BLOCK_SIZE)
        )
        entry = out.logprobs[0]
        assert entry.token_id == out.sampled_token_ids[0] == entry.top[0][0]
        assert {token for token, _ in entry.top} <= set(allowed)
        assert math.isclose(entry.logprob, entry.top[0][1])

    def test_prompt_logprobs_cover_every_position_whatever_the_chunking(self, ready: Executor) -> None:
        tokens = prompt(ready, 11, seed=17)
        params = GenerationParams(temperature=0.0, prompt_logprobs=3)
        whole = ready.execute(ExecutionBatch([scheduled(0, tokens, 0, 11, [0, 1, 2], params=params)], BLOCK_SIZE))
        entries = whole.prompt_logprobs[0]
        assert [e.token_id for e in entries] == tokens[1:], "one entry per prompt token after the first, in order"
        for entry in entries:
            top = [lp for _, lp in entry.top]
            assert len(top) == 3 and top == sorted(top, reverse=True)
            assert all(math.isfinite(lp) and lp <= 0.0 for lp in [entry.logprob, *top])
            assert sum(math.exp(lp) for lp in top) <= 1.0 + 1e-4, "the top alternatives hold more than all the mass"
            assert entry.rank >= 1 and entry.logprob <= top[0] + 1e-4
            if entry.token_id in dict(entry.top):
                assert math.isclose(entry.logprob, dict(entry.top)[entry.token_id], abs_tol=1e-4)
        table = [7, 3, 9]  # scattered blocks; the middle chunk does not sample
        chunked = []
        for start, count in ((0, 4), (4, 3), (7, 4)):
            out = ready.execute(ExecutionBatch([scheduled(1, tokens, start, count, table, params=params)], BLOCK_SIZE))
            chunked += out.prompt_logprobs[1]
        assert [e.token_id for e in chunked] == tokens[1:]
        for alone, piece in zip(entries, chunked, strict=True):
            assert math.isclose(piece.logprob, alone.logprob, rel_tol=1e-2, abs_tol=1e-2)

    def test_prompt_logprobs_agree_with_the_sampled_token_logprob(self, ready: Executor) -> None:
        prefix = prompt(ready, 6, seed=18)
        sampling = GenerationParams(temperature=0.0, logprobs=2)
        out = ready.execute(ExecutionBatch([scheduled(0, prefix, 0, 6, [0, 1], params=sampling)], BLOCK_SIZE))
        greedy = out.logprobs[0]
        tokens = [*prefix, out.sampled_token_ids[0]]
        scoring = GenerationParams(temperature=0.0, prompt_logprobs=2, max_tokens=0)
        neighbour = scheduled(2, prompt(ready, 5, seed=19), 0, 5, [4, 5])  # asks for none, gets none
        scored = ready.execute(
            ExecutionBatch([neighbour, scheduled(1, tokens, 0, 7, [2, 3], params=scoring)], BLOCK_SIZE)
        )
        assert set(scored.prompt_logprobs) <= {1} and not scored.prompt_logprobs.get(2)
        last = scored.prompt_logprobs[1][-1]
        assert last.token_id == greedy.token_id and last.rank == 1
        assert math.isclose(last.logprob, greedy.logprob, rel_tol=1e-3, abs_tol=1e-3)
        assert [t for t, _ in last.top] == [t for t, _ in greedy.top]

    @pytest.mark.parametrize("num_right", [0, 2, 3])
    def test_proposals_are_kept_while_they_match_plain_decoding(self, ready: Executor, num_right: int) -> None:
        """An executor with ``verifies_proposals``: kept while each equals the token plain decoding samples."""
        if not getattr(ready, "verifies_proposals", False):
            pytest.skip("this executor does not declare verifies_proposals")
        tokens = prompt(ready, 6, seed=20)
        plain = list(tokens)  # a greedy continuation of five tokens, one a step
        for step in range(5):
            start = 0 if step == 0 else len(plain) - 1
            out = ready.execute(
                ExecutionBatch([scheduled(0, plain, start, len(plain) - start, [0, 1, 2, 3])], BLOCK_SIZE)
            )
            plain.append(out.sampled_token_ids[0])
        first, after = plain[6], plain[7:]
        vocab_size = ready.model_info.vocab_size
        proposed = [*after[:num_right], (after[num_right] + 1) % vocab_size][:3]
        ready.execute(ExecutionBatch([scheduled(1, tokens, 0, 6, [4, 5, 6, 7])], BLOCK_SIZE))
        sequence = ScheduledSequence(
            seq_id=1,
            token_ids=[first, *proposed],
            start_position=6,
            block_table=[4, 5, 6, 7],
            do_sample=True,
            params=GREEDY,
            all_token_ids=[*tokens, first],
            num_prompt_tokens=6,
            seed=None,
            num_proposed=len(proposed),
        )
        out = ready.execute(ExecutionBatch([sequence], BLOCK_SIZE))
        assert out.num_accepted == {1: num_right}
        assert out.sampled_token_ids[1] == after[num_right]
