"""Numba CPU paged attention: parallel over (token, head), online softmax, reading the cache in place."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def write_kv(key, value, k_cache, v_cache, slot_mapping):
    block_size = k_cache.shape[1]
    for token in prange(key.shape[0]):
        slot = slot_mapping[token]
        if slot >= 0:
            k_cache[slot // block_size, slot % block_size] = key[token]
            v_cache[slot // block_size, slot % block_size] = value[token]


@njit(inline="always")
def _attend(out_row, q_row, k_cache, v_cache, table, num_positions, kv_head, scale, acc):
    """Online softmax over positions [0, num_positions) of one sequence, one head."""
    block_size = k_cache.shape[1]
    head_size = q_row.shape[0]
    running_max = -np.inf
    total = 0.0
    acc[:] = 0.0
    for position in range(num_positions):
        block = table[position // block_size]
        offset = position % block_size
        score = 0.0
        for d in range(head_size):
            score += q_row[d] * k_cache[block, offset, kv_head, d]
        score *= scale
        if score > running_max:
            correction = math.exp(running_max - score)
            total *= correction
            for d in range(head_size):
                acc[d] *= correction
            running_max = score
        weight = math.exp(score - running_max)
        total += weight
        for d in range(head_size):
            acc[d] += weight * v_cache[block, offset, kv_head, d]
    for d in range(head_size):
        out_row[d] = acc[d] / total


@njit(parallel=True, cache=True)
def paged_decode_attention(out, query, k_cache, v_cache, block_tables, context_lens, scale):
    batch, heads, head_size = query.shape
    group = heads // k_cache.shape[2]
    for item in prange(batch * heads):
        b = item // heads
        head = item % heads
        acc = np.empty(head_size, dtype=np.float64)
        _attend(out[b, head], query[b, head], k_cache, v_cache, block_tables[b], context_lens[b], head // group, scale, acc)


@njit(parallel=True, cache=True)
def paged_prefill_attention(out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale):
    num_tokens, heads, head_size = query.shape
    group = heads // k_cache.shape[2]
    for item in prange(num_tokens * heads):
        token = item // heads
        head = item % heads
        b = np.searchsorted(query_start_loc, token, side="right") - 1
        query_len = query_start_loc[b + 1] - query_start_loc[b]
        visible = context_lens[b] - query_len + (token - query_start_loc[b]) + 1
        acc = np.empty(head_size, dtype=np.float64)
        _attend(out[token, head], query[token, head], k_cache, v_cache, block_tables[b], visible, head // group, scale, acc)
