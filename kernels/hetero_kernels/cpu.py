"""Numba CPU paged attention, reading keys and values in place through the block tables.

A work item is one sequence (decode) or one query token (prefill) with all its
heads, run in parallel over the items. It walks the context one cache block
at a time, reading the block's rows in memory order: every query head's
scores against the block's keys (each key row read once for all the query
heads of its group), one online-softmax rescale (running maximum) per head
and block, then the weighted values. Scores and sums accumulate in float64;
dot products are summed in a fixed order, so ``fastmath`` stays off.

Arrays: ``query``/``out`` float32 or float64; caches float32, float64 or
float16. Numba has no float16 arithmetic on the CPU, so a float16 cache is
read through its raw bits and a 65536-entry decode table (exact).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from hetero_kernels.dtypes import FLOAT16_BITS_TO_FLOAT32, NO_DECODE_TABLE

_KERNEL = dict(parallel=True, fastmath=False, cache=True)


def _load(row, d, table):
    """``row[d]`` as a float64; a uint16 row holds float16 bits, decoded by ``table``."""
    if row.dtype == np.uint16:
        return float(table[row[d]])
    return float(row[d])


@overload(_load, inline="always")
def _load_overload(row, d, table):
    if row.dtype == types.uint16:
        return lambda row, d, table: np.float64(table[row[d]])
    return lambda row, d, table: np.float64(row[d])


@njit(inline="always")
def _dot(q_row, k_row, products, table):
    """``q_row . k_row`` summed as a fixed pairwise tree over ``products`` (vectorises without reassociation)."""
    n = q_row.shape[0]
    for d in range(n):
        products[d] = q_row[d] * _load(k_row, d, table)
    while n >= 16:  # fold the upper half onto the lower (an odd one out onto element 0)
        half = n // 2
        for d in range(half):
            products[d] = products[d] + products[half + d]
        for d in range(2 * half, n):
            products[0] += products[d]
        n = half
    total = 0.0
    for d in range(n):
        total += products[d]
    return total


@njit
def _attend(out_rows, q_rows, k_cache, v_cache, table, num_positions, scale, decode_table):
    """Attention of one token's query heads ``q_rows`` [heads, head_size] over positions
    ``[0, num_positions)`` of its sequence, block by block with an online softmax."""
    heads, head_size = q_rows.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    q = np.empty((heads, head_size), dtype=np.float64)
    for h in range(heads):
        for d in range(head_size):
            q[h, d] = q_rows[h, d] * scale
    acc = np.zeros((heads, head_size), dtype=np.float64)
    running_max = np.full(heads, -np.inf)
    total = np.zeros(heads, dtype=np.float64)
    weights = np.empty((heads, block_size), dtype=np.float64)
    products = np.empty(head_size, dtype=np.float64)
    for first in range(0, num_positions, block_size):
        block = table[first // block_size]
        count = min(block_size, num_positions - first)
        for j in range(count):
            for kv_head in range(kv_heads):
                k_row = k_cache[block, j, kv_head]
                for h in range(kv_head * group, (kv_head + 1) * group):
                    weights[h, j] = _dot(q[h], k_row, products, decode_table)
        for h in range(heads):
            block_max = -np.inf
            for j in range(count):
                block_max = max(block_max, weights[h, j])
            new_max = max(running_max[h], block_max)
            correction = math.exp(running_max[h] - new_max)
            total[h] *= correction
            acc_row = acc[h]
            for d in range(head_size):
                acc_row[d] *= correction
            for j in range(count):
                weights[h, j] = math.exp(weights[h, j] - new_max)
                total[h] += weights[h, j]
            running_max[h] = new_max
        for j in range(count):
            for kv_head in range(kv_heads):
                v_row = v_cache[block, j, kv_head]
                for h in range(kv_head * group, (kv_head + 1) * group):
                    weight = weights[h, j]
                    acc_row = acc[h]
                    for d in range(head_size):
                        acc_row[d] += weight * _load(v_row, d, decode_table)
    for h in range(heads):
        for d in range(head_size):
            out_rows[h, d] = acc[h, d] / total[h]


@njit(**_KERNEL)
def _copy_rows(key, value, k_cache, v_cache, slot_mapping):
    block_size = k_cache.shape[1]
    for token in prange(key.shape[0]):
        slot = slot_mapping[token]
        if slot >= 0:
            k_cache[slot // block_size, slot % block_size] = key[token]
            v_cache[slot // block_size, slot % block_size] = value[token]


@njit(**_KERNEL)
def _decode(out, query, k_cache, v_cache, block_tables, context_lens, scale, decode_table):
    for b in prange(query.shape[0]):
        _attend(out[b], query[b], k_cache, v_cache, block_tables[b], context_lens[b], scale, decode_table)


@njit(**_KERNEL)
def _prefill(out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, decode_table):
    for token in prange(query.shape[0]):
        b = np.searchsorted(query_start_loc, token, side="right") - 1
        query_len = query_start_loc[b + 1] - query_start_loc[b]
        visible = context_lens[b] - query_len + (token - query_start_loc[b]) + 1
        _attend(out[token], query[token], k_cache, v_cache, block_tables[b], visible, scale, decode_table)


def _cache_view(cache: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cache as the kernels read it, with its decode table (float16 becomes its raw bits)."""
    if cache.dtype == np.float16:
        return cache.view(np.uint16), FLOAT16_BITS_TO_FLOAT32
    return cache, NO_DECODE_TABLE


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Store ``key``/``value`` [T, kv_heads, head_size] at their slots (a negative slot is skipped)."""
    if k_cache.dtype == np.float16:
        key, value = key.astype(np.float16, copy=False).view(np.uint16), value.astype(np.float16, copy=False).view(np.uint16)
        k_cache, v_cache = k_cache.view(np.uint16), v_cache.view(np.uint16)
    _copy_rows(key, value, k_cache, v_cache, slot_mapping)


def paged_decode_attention(out, query, k_cache, v_cache, block_tables, context_lens, scale: float) -> None:
    """One query token per sequence [B, heads, head_size] over its ``context_lens[b]`` cached tokens."""
    (k, decode_table), (v, _) = _cache_view(k_cache), _cache_view(v_cache)
    _decode(out, query, k, v, block_tables, context_lens, float(scale), decode_table)


def paged_prefill_attention(out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale: float) -> None:
    """Chunks of query tokens [T, heads, head_size]; token i of sequence b sits at position
    ``context_lens[b] - q_len_b + i`` and attends causally to every position up to its own."""
    (k, decode_table), (v, _) = _cache_view(k_cache), _cache_view(v_cache)
    _prefill(out, query, k, v, block_tables, query_start_loc, context_lens, float(scale), decode_table)
