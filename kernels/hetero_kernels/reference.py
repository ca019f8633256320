"""Plain numpy paged attention: obviously correct, slow. The other kernels are tested against it."""

from __future__ import annotations

import numpy as np

from hetero_kernels.dtypes import widen


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Store ``key``/``value`` [T, kv_heads, head_size] at their slots (a negative slot is skipped)."""
    block_size = k_cache.shape[1]
    for token, slot in enumerate(slot_mapping):
        if slot >= 0:
            k_cache[slot // block_size, slot % block_size] = key[token]
            v_cache[slot // block_size, slot % block_size] = value[token]


def gather(cache, block_table, length: int) -> np.ndarray:
    """The first ``length`` positions of a sequence, [length, kv_heads, head_size], in float64
    (a ``uint16`` cache holds bfloat16 bits)."""
    block_size = cache.shape[1]
    positions = np.arange(length)
    return widen(cache[np.asarray(block_table)[positions // block_size], positions % block_size])


def attend(query, keys, values, scale: float) -> np.ndarray:
    """Softmax attention of one query [heads, head_size] over keys/values [L, kv_heads, head_size] (GQA)."""
    heads, kv_heads = query.shape[0], keys.shape[1]
    group = heads // kv_heads
    out = np.empty(query.shape, dtype=np.float64)
    for head in range(heads):
        scores = keys[:, head // group] @ query[head].astype(np.float64) * scale
        weights = np.exp(scores - scores.max())
        out[head] = weights @ values[:, head // group] / weights.sum()
    return out


def paged_decode_attention(out, query, k_cache, v_cache, block_tables, context_lens, scale: float) -> None:
    """One query token per sequence [B, heads, head_size] over its ``context_lens[b]`` cached tokens."""
    for b in range(query.shape[0]):
        length = int(context_lens[b])
        out[b] = attend(
            query[b], gather(k_cache, block_tables[b], length), gather(v_cache, block_tables[b], length), scale
        )


def paged_prefill_attention(
    out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale: float
) -> None:
    """Chunks of query tokens [T, heads, head_size]; token i of sequence b sits at position
    ``context_lens[b] - q_len_b + i`` and attends causally to every position up to its own."""
    for b in range(len(query_start_loc) - 1):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        length = int(context_lens[b])
        keys = gather(k_cache, block_tables[b], length)
        values = gather(v_cache, block_tables[b], length)
        for i, token in enumerate(range(start, end)):
            visible = length - (end - start) + i + 1
            out[token] = attend(query[token], keys[:visible], values[:visible], scale)
