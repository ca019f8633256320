"""Paged attention: logits must not depend on how a sequence is split into steps or where its blocks live."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_core.batch import ExecutionBatch, ScheduledSequence
from hetero_core.config import EngineConfig
from hetero_core.params import GenerationParams
from hetero_executor_torch import TorchExecutor

BLOCK_SIZE = 4
NUM_BLOCKS = 48
LENGTH = 23  # six blocks, the last one partly filled
GREEDY = GenerationParams(temperature=0.0, max_tokens=4)
TOLERANCE = dict(atol=1e-4, rtol=1e-4)


class RecordingSampler:
    """Keeps the logits each sequence was sampled from, then samples as usual."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler
        self.logits: dict[int, torch.Tensor] = {}

    def __call__(self, logits: torch.Tensor, seqs):
        for row, seq in zip(logits, seqs, strict=True):
            self.logits[seq.seq_id] = row.clone()
        return self.sampler(logits, seqs)


@pytest.fixture(scope="module")
def executor(tiny_model) -> TorchExecutor:
    executor = TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32")
    executor.initialize_cache(NUM_BLOCKS, BLOCK_SIZE)
    executor.sampler = RecordingSampler(executor.sampler)
    return executor


@pytest.fixture(scope="module")
def tokens() -> list[int]:
    rng = random.Random(5)
    return [rng.randrange(259) for _ in range(LENGTH)]


@pytest.fixture(scope="module")
def reference(tiny_model, tokens) -> torch.Tensor:
    """Logits at every position from one causal pass over the whole sequence through the plain torch
    attention (SDPA over the fresh keys and values), without reading the cache."""
    plain = TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", attention="torch")
    plain.initialize_cache(NUM_BLOCKS, BLOCK_SIZE)
    return plain.prefill_logits(tokens, list(range(-(-LENGTH // BLOCK_SIZE))))


def scheduled(seq_id: int, tokens: list[int], start: int, count: int, table: list[int]) -> ScheduledSequence:
    """``tokens[start:start + count]`` of one sequence, sampling after its last token."""
    return ScheduledSequence(
        seq_id, tokens[start : start + count], start, table, True, GREEDY, tokens[: start + count], start + count, None
    )


def step(executor: TorchExecutor, seq_id: int, tokens: list[int], start: int, count: int, table: list[int]) -> None:
    """Compute ``tokens[start:start + count]`` of one sequence, sampling after its last token."""
    executor.execute(ExecutionBatch([scheduled(seq_id, tokens, start, count, table)], BLOCK_SIZE))


def scattered_table(rng: random.Random, length: int) -> list[int]:
    """Distinct blocks in shuffled order."""
    return rng.sample(range(NUM_BLOCKS), -(-length // BLOCK_SIZE))


def poison(executor: TorchExecutor, blocks: list[int]) -> None:
    """Fill blocks with large values, so reading a slot that was never written cannot go unnoticed."""
    for k_cache, v_cache in executor.kv_caches:
        k_cache[blocks] = 50.0
        v_cache[blocks] = -50.0


def test_whole_prefill_matches_the_reference_at_its_last_token(executor, tokens, reference) -> None:
    table = scattered_table(random.Random(0), LENGTH)
    poison(executor, table)
    step(executor, 1, tokens, 0, LENGTH, table)
    torch.testing.assert_close(executor.sampler.logits[1], reference[-1], **TOLERANCE)


def test_token_by_token_decode_matches_the_reference_everywhere(executor, tokens, reference) -> None:
    table = scattered_table(random.Random(1), LENGTH)
    poison(executor, table)
    for position in range(LENGTH):
        step(executor, 2, tokens, position, 1, table)
        torch.testing.assert_close(executor.sampler.logits[2], reference[position], **TOLERANCE)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.sets(st.integers(1, LENGTH - 1), max_size=6), shuffle_seed=st.integers(0, 2**16))
def test_chunked_prefill_matches_the_reference_at_every_chunk_end(
    executor, tokens, reference, cuts, shuffle_seed
) -> None:
    table = scattered_table(random.Random(shuffle_seed), LENGTH)
    poison(executor, table)
    bounds = [0, *sorted(cuts), LENGTH]
    for start, end in itertools.pairwise(bounds):
        step(executor, 3, tokens, start, end - start, table)
        torch.testing.assert_close(executor.sampler.logits[3], reference[end - 1], **TOLERANCE)


def test_prefill_and_decodes_in_one_batch_match_the_reference(executor, tokens, reference) -> None:
    """Decodes of different lengths and a cached chunk share a step; each still sees only its own blocks."""
    blocks = scattered_table(random.Random(2), 3 * LENGTH)  # distinct: one sequence must not write another's blocks
    per_sequence = len(blocks) // 3
    tables = {seq_id: blocks[i * per_sequence : (i + 1) * per_sequence] for i, seq_id in enumerate((10, 11, 12))}
    poison(executor, [b for t in tables.values() for b in t])
    step(executor, 10, tokens, 0, 9, tables[10])
    step(executor, 11, tokens, 0, 17, tables[11])
    step(executor, 12, tokens, 0, 5, tables[12])
    batch = [
        ScheduledSequence(10, tokens[9:10], 9, tables[10], True, GREEDY, tokens[:10], 10, None),
        ScheduledSequence(11, tokens[17:18], 17, tables[11], True, GREEDY, tokens[:18], 18, None),
        ScheduledSequence(12, tokens[5:20], 5, tables[12], True, GREEDY, tokens[:20], 20, None),
    ]
    executor.execute(ExecutionBatch(batch, BLOCK_SIZE))
    for seq_id, position in ((10, 9), (11, 17), (12, 19)):
        torch.testing.assert_close(executor.sampler.logits[seq_id], reference[position], **TOLERANCE)


def test_siblings_sharing_the_prompt_blocks_each_compute_their_last_block(executor, tokens, reference) -> None:
    """Sibling samples read the full prompt blocks one of them computed, in one step, each with its own last block."""
    blocks = scattered_table(
        random.Random(3), 4 * BLOCK_SIZE
    )  # two shared blocks, a last block for each of two siblings
    shared, tails = blocks[:2], blocks[2:]
    poison(executor, blocks)
    step(executor, 20, tokens, 0, 8, shared)
    executor.execute(
        ExecutionBatch([scheduled(20 + i, tokens, 8, 3, [*shared, tail]) for i, tail in enumerate(tails)], BLOCK_SIZE)
    )
    for seq_id in (20, 21):
        torch.testing.assert_close(executor.sampler.logits[seq_id], reference[10], **TOLERANCE)
