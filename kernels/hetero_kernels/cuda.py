"""Numba CUDA paged attention.

Decode is split-K ("flash-decoding"): a thread block per (sequence, head,
split) walks its share of the context in tiles of ``TILE`` tokens (one token
per thread for the scores, one head dimension per thread for the weighted
values), keeping an online softmax; a second kernel merges the splits. Long
contexts therefore spread over many blocks even at batch 1. Prefill gives a
block to each (query token, head), causal over cached and new tokens.

The functions accept device arrays or anything with
``__cuda_array_interface__`` (torch CUDA tensors included); given torch
tensors they launch on torch's current stream, so nothing round-trips
through the host. Accumulation is in float32 whatever the cache dtype.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

TILE = 128  # threads per block; tokens per tile
MAX_HEAD_SIZE = 256
TOKENS_PER_SPLIT = 512


def _device(array):
    """Numba device arrays and numpy arrays pass through; CUDA-array-interface objects (torch) are wrapped."""
    if isinstance(array, np.ndarray) or hasattr(array, "copy_to_host"):
        return array
    return cuda.as_cuda_array(array)


def _stream(*arrays):
    """torch's current stream when any argument is a torch tensor, else the default stream."""
    for array in arrays:
        if type(array).__module__.startswith("torch"):
            import torch

            return cuda.external_stream(torch.cuda.current_stream(array.device).cuda_stream)
    return 0


@cuda.jit
def _write_kv_kernel(key, value, k_cache, v_cache, slot_mapping):
    token = cuda.blockIdx.x
    slot = slot_mapping[token]
    if slot < 0:
        return
    block_size = k_cache.shape[1]
    block, offset = slot // block_size, slot % block_size
    kv_heads, head_size = key.shape[1], key.shape[2]
    for item in range(cuda.threadIdx.x, kv_heads * head_size, cuda.blockDim.x):
        head, d = item // head_size, item % head_size
        k_cache[block, offset, head, d] = key[token, head, d]
        v_cache[block, offset, head, d] = value[token, head, d]


@cuda.jit(device=True)
def _block_reduce(values, tid, use_max):
    """Reduce ``values[0:TILE]`` in shared memory; every thread gets the result."""
    stride = TILE // 2
    while stride > 0:
        if tid < stride:
            if use_max:
                values[tid] = max(values[tid], values[tid + stride])
            else:
                values[tid] += values[tid + stride]
        cuda.syncthreads()
        stride //= 2
    result = values[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def _attend_range(q_shared, k_cache, v_cache, table, kv_head, start, end, scale, weights, scratch, tid):
    """Online softmax over positions [start, end): returns (running max, total, acc for dimension ``tid``)."""
    block_size = k_cache.shape[1]
    head_size = k_cache.shape[3]
    running_max = -math.inf
    total = float32(0.0)
    acc = float32(0.0)
    for tile in range(start, end, TILE):
        position = tile + tid
        score = -math.inf
        if position < end:
            block = table[position // block_size]
            offset = position % block_size
            dot = float32(0.0)
            for d in range(head_size):
                dot += q_shared[d] * float32(k_cache[block, offset, kv_head, d])
            score = dot * scale
        scratch[tid] = score
        cuda.syncthreads()
        new_max = max(running_max, _block_reduce(scratch, tid, True))
        weight = math.exp(score - new_max) if position < end else float32(0.0)
        weights[tid] = weight
        scratch[tid] = weight
        cuda.syncthreads()
        tile_total = _block_reduce(scratch, tid, False)
        correction = math.exp(running_max - new_max) if running_max != -math.inf else float32(0.0)
        total = total * correction + tile_total
        if tid < head_size:
            acc *= correction
            for j in range(min(TILE, end - tile)):
                p = tile + j
                acc += weights[j] * float32(v_cache[table[p // block_size], p % block_size, kv_head, tid])
        running_max = new_max
        cuda.syncthreads()
    return running_max, total, acc


@cuda.jit
def _decode_split_kernel(partial_acc, partial_max, partial_total, query, k_cache, v_cache, block_tables, context_lens, scale):
    b, head, split = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
    tid = cuda.threadIdx.x
    q_shared = cuda.shared.array(MAX_HEAD_SIZE, float32)
    weights = cuda.shared.array(TILE, float32)
    scratch = cuda.shared.array(TILE, float32)
    head_size = query.shape[2]
    if tid < head_size:
        q_shared[tid] = query[b, head, tid]
    cuda.syncthreads()
    length = context_lens[b]
    start = split * TOKENS_PER_SPLIT
    end = min(length, start + TOKENS_PER_SPLIT)
    kv_head = head // (query.shape[1] // k_cache.shape[2])
    running_max, total, acc = _attend_range(q_shared, k_cache, v_cache, block_tables[b], kv_head, start, end, scale, weights, scratch, tid)
    if tid < head_size:
        partial_acc[b, head, split, tid] = acc
    if tid == 0:
        partial_max[b, head, split] = running_max
        partial_total[b, head, split] = total


@cuda.jit
def _merge_splits_kernel(out, partial_acc, partial_max, partial_total, context_lens):
    b, head, d = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    if d >= out.shape[2]:
        return
    num_splits = (context_lens[b] + TOKENS_PER_SPLIT - 1) // TOKENS_PER_SPLIT
    best = -math.inf
    for split in range(num_splits):
        best = max(best, partial_max[b, head, split])
    total = float32(0.0)
    acc = float32(0.0)
    for split in range(num_splits):
        factor = math.exp(partial_max[b, head, split] - best)
        total += partial_total[b, head, split] * factor
        acc += partial_acc[b, head, split, d] * factor
    out[b, head, d] = acc / total


@cuda.jit
def _prefill_kernel(out, query, k_cache, v_cache, block_tables, token_seq, query_start_loc, context_lens, scale):
    token, head = cuda.blockIdx.x, cuda.blockIdx.y
    tid = cuda.threadIdx.x
    q_shared = cuda.shared.array(MAX_HEAD_SIZE, float32)
    weights = cuda.shared.array(TILE, float32)
    scratch = cuda.shared.array(TILE, float32)
    head_size = query.shape[2]
    if tid < head_size:
        q_shared[tid] = query[token, head, tid]
    cuda.syncthreads()
    b = token_seq[token]
    query_len = query_start_loc[b + 1] - query_start_loc[b]
    visible = context_lens[b] - query_len + (token - query_start_loc[b]) + 1
    kv_head = head // (query.shape[1] // k_cache.shape[2])
    _, total, acc = _attend_range(q_shared, k_cache, v_cache, block_tables[b], kv_head, 0, visible, scale, weights, scratch, tid)
    if tid < head_size:
        out[token, head, tid] = acc / total


def _check_head_size(head_size: int) -> None:
    if head_size > min(TILE, MAX_HEAD_SIZE):
        raise ValueError(f"head_size {head_size} exceeds the kernels' limit of {min(TILE, MAX_HEAD_SIZE)}")


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    stream = _stream(key, value, k_cache, v_cache, slot_mapping)
    args = [_device(a) for a in (key, value, k_cache, v_cache, slot_mapping)]
    _write_kv_kernel[key.shape[0], TILE, stream](*args)


def paged_decode_attention(out, query, k_cache, v_cache, block_tables, context_lens, scale: float) -> None:
    batch, heads, head_size = query.shape
    _check_head_size(head_size)
    stream = _stream(out, query, k_cache)
    max_len = int(np.max(context_lens)) if isinstance(context_lens, np.ndarray) else int(context_lens.max())
    num_splits = max(1, (max_len + TOKENS_PER_SPLIT - 1) // TOKENS_PER_SPLIT)
    partial_acc = cuda.device_array((batch, heads, num_splits, head_size), np.float32, stream=stream)
    partial_max = cuda.device_array((batch, heads, num_splits), np.float32, stream=stream)
    partial_total = cuda.device_array((batch, heads, num_splits), np.float32, stream=stream)
    args = [_device(a) for a in (query, k_cache, v_cache, block_tables, context_lens)]
    _decode_split_kernel[(batch, heads, num_splits), TILE, stream](partial_acc, partial_max, partial_total, *args, np.float32(scale))
    _merge_splits_kernel[(batch, heads), head_size, stream](_device(out), partial_acc, partial_max, partial_total, args[-1])


def paged_prefill_attention(out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale: float) -> None:
    num_tokens, heads, head_size = query.shape
    _check_head_size(head_size)
    stream = _stream(out, query, k_cache)
    starts = np.asarray(query_start_loc.tolist() if not isinstance(query_start_loc, np.ndarray) else query_start_loc)
    token_seq = np.repeat(np.arange(len(starts) - 1, dtype=np.int32), np.diff(starts))
    token_seq_device = cuda.to_device(token_seq, stream=stream)
    args = [_device(a) for a in (out, query, k_cache, v_cache, block_tables)]
    _prefill_kernel[(num_tokens, heads), TILE, stream](
        *args, token_seq_device, _device(query_start_loc), _device(context_lens), np.float32(scale)
    )
