"""Hypothesis strategies for paged-attention problems.

Shapes (batch, heads, KV heads with grouped-query attention, head size, block
size, ragged context lengths including 1 and exact multiples of the block
size, prefill chunk lengths) are drawn by hypothesis, so a failure shrinks to
a small shape; values come from a drawn seed. With a bfloat16 cache, the
queries are bfloat16 numbers in about half the problems. Physical blocks are shuffled,
and every slot no sequence owns holds ``GARBAGE``, so a read outside a
sequence's context ruins the result.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from hypothesis import strategies as st

from hetero_kernels.dtypes import bfloat16_bits

BFLOAT16 = "bfloat16"  # a cache_dtypes entry: the cache as bfloat16 bits (uint16), as the kernels take it

GARBAGE = 1e4  # large but finite in float16 (max 65504)


@attrs.define
class Prefill:
    """Query chunks: the last ``q_len_b`` positions of each sequence's context."""

    query: np.ndarray  # [T, heads, head_size]
    query_start_loc: np.ndarray  # [B + 1] int32


@attrs.define
class Problem:
    query: np.ndarray  # [B, heads, head_size] float32
    k_cache: np.ndarray  # [num_blocks, block_size, kv_heads, head_size]
    v_cache: np.ndarray
    block_tables: np.ndarray  # [B, max_blocks] int32
    context_lens: np.ndarray  # [B] int32
    scale: float
    prefill: Prefill
    seed: int

    @property
    def decode_args(self) -> tuple:
        return (self.query, self.k_cache, self.v_cache, self.block_tables, self.context_lens, self.scale)

    @property
    def prefill_args(self) -> tuple:
        p = self.prefill
        return (
            p.query,
            self.k_cache,
            self.v_cache,
            self.block_tables,
            p.query_start_loc,
            self.context_lens,
            self.scale,
        )

    def new_kv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keys/values for up to 5 distinct slots, one of them skipped (slot -1), as a step writes them."""
        rng = np.random.default_rng(self.seed + 1)
        num_slots = self.k_cache.shape[0] * self.k_cache.shape[1]
        slots = rng.choice(num_slots, size=min(5, num_slots), replace=False).astype(np.int64)
        slots[0] = -1
        shape = (len(slots), *self.k_cache.shape[2:])
        convert = bfloat16_bits if self.k_cache.dtype == np.uint16 else lambda a: a.astype(self.k_cache.dtype)
        return convert(rng.standard_normal(shape)), convert(rng.standard_normal(shape)), slots


def _bfloat16_numbers(values: np.ndarray) -> np.ndarray:
    """``values`` rounded to bfloat16, as float32."""
    return (bfloat16_bits(values).astype(np.uint32) << 16).view(np.float32)


@st.composite
def problems(
    draw,
    *,
    max_batch: int = 4,
    max_group: int = 4,
    max_kv_heads: int = 3,
    head_sizes: tuple[int, ...] = (1, 4, 8, 16, 24, 40, 64, 96, 128),
    block_sizes: tuple[int, ...] = (1, 2, 3, 4, 8, 16),
    max_len: int = 70,
    cache_dtypes: tuple = (np.float32, np.float16),
) -> Problem:
    batch = draw(st.integers(1, max_batch))
    kv_heads = draw(st.integers(1, max_kv_heads))
    heads = kv_heads * draw(st.integers(1, max_group))
    head_size = draw(st.sampled_from(head_sizes))
    block_size = draw(st.sampled_from(block_sizes))
    multiples = st.integers(1, max(1, max_len // block_size)).map(lambda n: n * block_size)
    length = st.one_of(st.just(1), multiples, st.integers(1, max_len))
    lengths = draw(st.lists(length, min_size=batch, max_size=batch))
    query_lens = [draw(st.integers(1, n)) for n in lengths]
    dtype = draw(st.sampled_from(cache_dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)

    needed = [math.ceil(n / block_size) for n in lengths]
    num_blocks = sum(needed) + 2  # two blocks no sequence owns
    physical = rng.permutation(num_blocks).astype(np.int32)
    k_cache = np.full(
        (num_blocks, block_size, kv_heads, head_size), GARBAGE, dtype=np.float32 if dtype == BFLOAT16 else dtype
    )
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
    if dtype == BFLOAT16:
        k_cache, v_cache = bfloat16_bits(k_cache), bfloat16_bits(v_cache)
    # a bfloat16 model's queries are bfloat16 numbers, which the kernels may multiply as they are
    queries = (
        _bfloat16_numbers if dtype == BFLOAT16 and draw(st.booleans()) else lambda values: values.astype(np.float32)
    )
    query = queries(rng.standard_normal((batch, heads, head_size)))
    starts = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    prefill = Prefill(queries(rng.standard_normal((int(starts[-1]), heads, head_size))), starts)
    return Problem(
        query, k_cache, v_cache, tables, np.array(lengths, dtype=np.int32), float(head_size**-0.5), prefill, seed
    )
