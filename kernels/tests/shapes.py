"""Random paged-attention problems: ragged lengths, GQA, shuffled blocks, garbage in unused blocks."""

from __future__ import annotations

import math

import attrs
import numpy as np

GARBAGE = 1e4  # unused blocks hold this: any out-of-range read ruins the result


@attrs.define
class Chunks:
    query: np.ndarray  # [T, heads, head_size]
    query_start_loc: np.ndarray  # [B + 1]


@attrs.define
class Case:
    query: np.ndarray  # [B, heads, head_size]
    k_cache: np.ndarray
    v_cache: np.ndarray
    block_tables: np.ndarray  # [B, max_blocks] int32
    context_lens: np.ndarray  # [B] int32
    scale: float

    def prefill_chunks(self, rng: np.random.Generator) -> Chunks:
        """A chunk of 1..context_len new tokens per sequence (the tail of its context)."""
        lengths = [int(rng.integers(1, n + 1)) for n in self.context_lens]
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        query = rng.standard_normal((starts[-1], *self.query.shape[1:])).astype(self.query.dtype)
        return Chunks(query, starts)

    def new_kv(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keys/values for a few slots (one skipped with -1), as a step would write them."""
        num_slots = self.k_cache.shape[0] * self.k_cache.shape[1]
        slots = rng.choice(num_slots, size=min(5, num_slots), replace=False).astype(np.int64)
        slots[0] = -1
        shape = (len(slots), *self.k_cache.shape[2:])
        return rng.standard_normal(shape).astype(self.k_cache.dtype), rng.standard_normal(shape).astype(self.k_cache.dtype), slots


def random_case(
    rng: np.random.Generator, *, max_batch: int = 4, max_heads: int = 8, max_head_size: int = 32, max_len: int = 70, dtype=np.float32
) -> Case:
    batch = int(rng.integers(1, max_batch + 1))
    kv_heads = int(rng.choice([h for h in (1, 2, 4) if h <= max_heads]))
    heads = kv_heads * int(rng.integers(1, max(2, max_heads // kv_heads) + 1))
    head_size = int(rng.choice([s for s in (4, 8, 16, 32, 64) if s <= max_head_size]))
    block_size = int(rng.choice([1, 2, 3, 4, 8, 16]))
    lengths = [int(rng.choice([1, block_size, 2 * block_size, rng.integers(1, max_len + 1)])) for _ in range(batch)]
    needed = [math.ceil(n / block_size) for n in lengths]
    num_blocks = sum(needed) + 3
    physical = rng.permutation(num_blocks)
    k_cache = np.full((num_blocks, block_size, kv_heads, head_size), GARBAGE, dtype=dtype)
    v_cache = np.full_like(k_cache, GARBAGE)
    tables = np.zeros((batch, max(needed)), dtype=np.int32)
    used = 0
    for b, count in enumerate(needed):
        tables[b, :count] = physical[used : used + count]
        used += count
        for position in range(lengths[b]):
            block, offset = tables[b, position // block_size], position % block_size
            k_cache[block, offset] = rng.standard_normal((kv_heads, head_size))
            v_cache[block, offset] = rng.standard_normal((kv_heads, head_size))
    query = rng.standard_normal((batch, heads, head_size)).astype(dtype)
    return Case(query, k_cache, v_cache, tables, np.array(lengths, dtype=np.int32), float(head_size**-0.5))
