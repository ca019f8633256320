"""Numba CUDA paged attention, reading keys and values in place through the block tables.

A thread block serves one KV head and the query heads that share it (up to
``MAX_GROUP`` of them, so every key and value is read once per group) over a
chunk of at most ``TOKENS_PER_SPLIT`` context positions:

1. scores: the chunk's keys are staged through shared memory ``KEY_DIMS``
   dimensions at a time (coalesced loads), one thread per position;
2. the chunk's maximum and exp-sum per head, by tree reductions;
3. values: one thread per (head, dimension) output element, coalesced.

Decode is split-K ("flash-decoding"): a block per (sequence, head group,
chunk), so a long context spreads over many blocks even at batch 1, and a
second kernel merges the chunks. Prefill gives a block to each (query token,
head group) and folds its chunks together with an online softmax.

Inputs may be numba device arrays, numpy arrays (copied by numba) or torch
CUDA tensors (launched on torch's current stream, scratch from torch's
allocator: no host sync). Caches and queries may be float16 or float32;
everything accumulates in float32. ``context_lens`` must be at least 1, and
``block_tables`` wide enough for the longest context (its width bounds the
number of decode chunks, so no length needs to be read back to the host).

The module constants are read when a kernel is compiled (on the simulator,
when it runs): change them before the first launch.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from numba import cuda, float32

from hetero_kernels.cuda_interop import LaunchContext, device_array

TILE = 128  # threads per block (a power of two)
TOKENS_PER_SPLIT = 256  # context positions per chunk
KEY_DIMS = 32  # key dimensions staged in shared memory at a time
MAX_GROUP = 4  # query heads per block (more share a KV head: several blocks serve them)
MAX_HEAD_SIZE = 256
MAX_SHARED_BYTES = 48 * 1024  # static shared memory per thread block

# Shared-memory array sizes must be single compile-time constants: kept in step by configure().
_QUERY_SIZE = MAX_GROUP * MAX_HEAD_SIZE
_SCORES_SIZE = MAX_GROUP * TOKENS_PER_SPLIT
_KEYS_SIZE = TILE * (KEY_DIMS + 1)
_SCRATCH_SIZE = MAX_GROUP * TILE
_STATS_SIZE = 2 * MAX_GROUP


def _prefill_shared_bytes(tile: int, tokens_per_split: int, key_dims: int, max_group: int, max_head_size: int) -> int:
    """The prefill kernel's shared arrays (the decode kernel's are a subset), in bytes."""
    floats = 2 * max_group * max_head_size + max_group * tokens_per_split + tile * (key_dims + 1) + max_group * tile + 4 * max_group
    return 4 * floats


def configure(
    *,
    tile: int | None = None,
    tokens_per_split: int | None = None,
    key_dims: int | None = None,
    max_group: int | None = None,
    max_head_size: int | None = None,
) -> None:
    """Change the launch shape (the simulator tests use a small one); what is not given stays.

    Only before the first launch: on a GPU the constants are compiled into the kernels.
    """
    global TILE, TOKENS_PER_SPLIT, KEY_DIMS, MAX_GROUP, MAX_HEAD_SIZE, _QUERY_SIZE, _SCORES_SIZE, _KEYS_SIZE, _SCRATCH_SIZE, _STATS_SIZE
    if any(getattr(kernel, "overloads", None) for kernel in (_decode_split_kernel, _merge_splits_kernel, _prefill_kernel)):
        raise RuntimeError("hetero_kernels.cuda.configure() must run before the first kernel launch")
    tile = TILE if tile is None else tile
    tokens_per_split = TOKENS_PER_SPLIT if tokens_per_split is None else tokens_per_split
    key_dims = KEY_DIMS if key_dims is None else key_dims
    max_group = MAX_GROUP if max_group is None else max_group
    max_head_size = MAX_HEAD_SIZE if max_head_size is None else max_head_size
    if tile < 1 or tile > 1024 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two up to 1024 (threads per block), got {tile}")
    shared = _prefill_shared_bytes(tile, tokens_per_split, key_dims, max_group, max_head_size)
    if shared > MAX_SHARED_BYTES:
        raise ValueError(f"this launch shape needs {shared} bytes of shared memory per block; the limit is {MAX_SHARED_BYTES}")
    TILE, TOKENS_PER_SPLIT, KEY_DIMS, MAX_GROUP, MAX_HEAD_SIZE = tile, tokens_per_split, key_dims, max_group, max_head_size
    _QUERY_SIZE, _SCORES_SIZE, _KEYS_SIZE = MAX_GROUP * MAX_HEAD_SIZE, MAX_GROUP * TOKENS_PER_SPLIT, TILE * (KEY_DIMS + 1)
    _SCRATCH_SIZE, _STATS_SIZE = MAX_GROUP * TILE, 2 * MAX_GROUP


@cuda.jit(device=True)
def _tree_reduce(values, num_heads, tid, use_max):
    """Reduce ``values[g * TILE : (g + 1) * TILE]`` into ``values[g * TILE]`` for each head ``g``."""
    stride = TILE // 2
    while stride > 0:
        if tid < stride:
            for g in range(num_heads):
                a = values[g * TILE + tid]
                b = values[g * TILE + tid + stride]
                values[g * TILE + tid] = max(a, b) if use_max else a + b
        cuda.syncthreads()
        stride //= 2


@cuda.jit(device=True)
def _chunk_softmax(q_shared, k_cache, table, kv_head, num_heads, start, end, scores, keys, scratch, stats, tid):
    """Softmax weights of positions [start, end) for ``num_heads`` heads.

    On return ``scores[g * TOKENS_PER_SPLIT + t]`` is ``exp(s - m_g)`` for
    position ``start + t``, ``stats[g]`` the chunk maximum ``m_g`` and
    ``stats[MAX_GROUP + g]`` the sum of the weights. ``q_shared`` holds the
    queries, already scaled, with a row of ``MAX_HEAD_SIZE`` per head.
    """
    block_size = k_cache.shape[1]
    head_size = k_cache.shape[3]
    count = end - start
    # Per-thread values live in MAX_GROUP-long local arrays indexed only in loops
    # of constant trip count, so they can stay in registers; rows past
    # ``num_heads`` hold zero queries and are ignored.
    thread_max = cuda.local.array(MAX_GROUP, float32)
    dots = cuda.local.array(MAX_GROUP, float32)
    for g in range(MAX_GROUP):
        thread_max[g] = -math.inf
    for tile in range(0, count, TILE):
        t = tile + tid
        for g in range(MAX_GROUP):
            dots[g] = 0.0
        for first_dim in range(0, head_size, KEY_DIMS):
            for item in range(tid, TILE * KEY_DIMS, TILE):
                row, dim = item // KEY_DIMS, item % KEY_DIMS
                position = start + tile + row
                if position < end and first_dim + dim < head_size:
                    block = table[position // block_size]
                    keys[row * (KEY_DIMS + 1) + dim] = k_cache[block, position % block_size, kv_head, first_dim + dim]
            cuda.syncthreads()
            if t < count:
                for dim in range(min(KEY_DIMS, head_size - first_dim)):
                    key = float32(keys[tid * (KEY_DIMS + 1) + dim])
                    for g in range(MAX_GROUP):
                        dots[g] += q_shared[g * MAX_HEAD_SIZE + first_dim + dim] * key
            cuda.syncthreads()
        if t < count:
            for g in range(MAX_GROUP):
                if g < num_heads:
                    scores[g * TOKENS_PER_SPLIT + t] = dots[g]
                    thread_max[g] = max(thread_max[g], dots[g])
    for g in range(MAX_GROUP):
        if g < num_heads:
            scratch[g * TILE + tid] = thread_max[g]
    cuda.syncthreads()
    _tree_reduce(scratch, num_heads, tid, True)
    if tid < num_heads:
        stats[tid] = scratch[tid * TILE]
    cuda.syncthreads()
    thread_sum = dots
    for g in range(MAX_GROUP):
        thread_sum[g] = 0.0
    for t in range(tid, count, TILE):
        for g in range(MAX_GROUP):
            if g < num_heads:
                weight = math.exp(scores[g * TOKENS_PER_SPLIT + t] - stats[g])
                scores[g * TOKENS_PER_SPLIT + t] = weight
                thread_sum[g] += weight
    for g in range(MAX_GROUP):
        if g < num_heads:
            scratch[g * TILE + tid] = thread_sum[g]
    cuda.syncthreads()
    _tree_reduce(scratch, num_heads, tid, False)
    if tid < num_heads:
        stats[MAX_GROUP + tid] = scratch[tid * TILE]
    cuda.syncthreads()


@cuda.jit(device=True)
def _weighted_value(v_cache, table, kv_head, start, count, scores, g, dim):
    """Sum over the chunk's positions of weight x value, for head ``g`` and dimension ``dim``."""
    block_size = v_cache.shape[1]
    acc = float32(0.0)
    for t in range(count):
        position = start + t
        block = table[position // block_size]
        acc += scores[g * TOKENS_PER_SPLIT + t] * float32(v_cache[block, position % block_size, kv_head, dim])
    return acc


@cuda.jit(device=True)
def _load_queries(q_shared, query, token, first_head, num_heads, scale, tid):
    """Scaled queries of heads ``first_head ..`` into rows of ``q_shared``; rows past ``num_heads`` are zero."""
    head_size = query.shape[2]
    for item in range(tid, MAX_GROUP * head_size, TILE):
        g, dim = item // head_size, item % head_size
        value = float32(0.0)
        if g < num_heads:
            value = float32(query[token, first_head + g, dim]) * scale
        q_shared[g * MAX_HEAD_SIZE + dim] = value
    cuda.syncthreads()


@cuda.jit(device=True)
def _head_group(num_heads, num_kv_heads, heads_per_block, blocks_per_kv_head, y):
    """(kv head, first query head, number of query heads) served by grid row ``y``."""
    group = num_heads // num_kv_heads
    kv_head = y // blocks_per_kv_head
    first_head = kv_head * group + (y % blocks_per_kv_head) * heads_per_block
    return kv_head, first_head, min(heads_per_block, (kv_head + 1) * group - first_head)


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
        head, dim = item // head_size, item % head_size
        k_cache[block, offset, head, dim] = key[token, head, dim]
        v_cache[block, offset, head, dim] = value[token, head, dim]


@cuda.jit
def _decode_split_kernel(
    partial_acc, partial_stats, query, k_cache, v_cache, block_tables, context_lens, scale, heads_per_block, blocks_per_kv_head
):
    b, split, tid = cuda.blockIdx.x, cuda.blockIdx.z, cuda.threadIdx.x
    start = split * TOKENS_PER_SPLIT
    length = context_lens[b]
    if start >= length:
        return
    end = min(length, start + TOKENS_PER_SPLIT)
    q_shared = cuda.shared.array(_QUERY_SIZE, float32)
    scores = cuda.shared.array(_SCORES_SIZE, float32)
    keys = cuda.shared.array(_KEYS_SIZE, float32)
    scratch = cuda.shared.array(_SCRATCH_SIZE, float32)
    stats = cuda.shared.array(_STATS_SIZE, float32)
    kv_head, first_head, num_heads = _head_group(query.shape[1], k_cache.shape[2], heads_per_block, blocks_per_kv_head, cuda.blockIdx.y)
    _load_queries(q_shared, query, b, first_head, num_heads, scale, tid)
    table = block_tables[b]
    _chunk_softmax(q_shared, k_cache, table, kv_head, num_heads, start, end, scores, keys, scratch, stats, tid)
    head_size = query.shape[2]
    for item in range(tid, num_heads * head_size, TILE):
        g, dim = item // head_size, item % head_size
        partial_acc[b, first_head + g, split, dim] = _weighted_value(v_cache, table, kv_head, start, end - start, scores, g, dim)
    if tid < num_heads:
        partial_stats[b, first_head + tid, split, 0] = stats[tid]
        partial_stats[b, first_head + tid, split, 1] = stats[MAX_GROUP + tid]


@cuda.jit
def _merge_splits_kernel(out, partial_acc, partial_stats, context_lens):
    b, head = cuda.blockIdx.x, cuda.blockIdx.y
    num_splits = (context_lens[b] + TOKENS_PER_SPLIT - 1) // TOKENS_PER_SPLIT
    best = float32(-math.inf)
    for split in range(num_splits):
        best = max(best, partial_stats[b, head, split, 0])
    total = float32(0.0)
    for split in range(num_splits):
        total += partial_stats[b, head, split, 1] * math.exp(partial_stats[b, head, split, 0] - best)
    for dim in range(cuda.threadIdx.x, out.shape[2], cuda.blockDim.x):
        acc = float32(0.0)
        for split in range(num_splits):
            acc += partial_acc[b, head, split, dim] * math.exp(partial_stats[b, head, split, 0] - best)
        out[b, head, dim] = acc / total


@cuda.jit(device=True)
def _sequence_of(query_start_loc, token):
    """The sequence whose query rows include ``token`` (binary search)."""
    low, high = 0, query_start_loc.shape[0] - 1
    while high - low > 1:
        middle = (low + high) // 2
        if query_start_loc[middle] <= token:
            low = middle
        else:
            high = middle
    return low


@cuda.jit
def _prefill_kernel(out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, heads_per_block, blocks_per_kv_head):
    token, tid = cuda.blockIdx.x, cuda.threadIdx.x
    q_shared = cuda.shared.array(_QUERY_SIZE, float32)
    scores = cuda.shared.array(_SCORES_SIZE, float32)
    keys = cuda.shared.array(_KEYS_SIZE, float32)
    scratch = cuda.shared.array(_SCRATCH_SIZE, float32)
    stats = cuda.shared.array(_STATS_SIZE, float32)
    running = cuda.shared.array(_STATS_SIZE, float32)  # running max, running sum per head
    acc = cuda.shared.array(_QUERY_SIZE, float32)
    kv_head, first_head, num_heads = _head_group(query.shape[1], k_cache.shape[2], heads_per_block, blocks_per_kv_head, cuda.blockIdx.y)
    _load_queries(q_shared, query, token, first_head, num_heads, scale, tid)
    b = _sequence_of(query_start_loc, token)
    query_len = query_start_loc[b + 1] - query_start_loc[b]
    visible = context_lens[b] - query_len + (token - query_start_loc[b]) + 1
    table = block_tables[b]
    head_size = query.shape[2]
    if tid < num_heads:
        running[tid] = -math.inf
        running[MAX_GROUP + tid] = 0.0
    for item in range(tid, num_heads * head_size, TILE):
        acc[item] = 0.0
    cuda.syncthreads()
    for start in range(0, visible, TOKENS_PER_SPLIT):
        end = min(visible, start + TOKENS_PER_SPLIT)
        _chunk_softmax(q_shared, k_cache, table, kv_head, num_heads, start, end, scores, keys, scratch, stats, tid)
        for item in range(tid, num_heads * head_size, TILE):
            g, dim = item // head_size, item % head_size
            new_max = max(running[g], stats[g])
            chunk_value = _weighted_value(v_cache, table, kv_head, start, end - start, scores, g, dim)
            acc[item] = acc[item] * math.exp(running[g] - new_max) + chunk_value * math.exp(stats[g] - new_max)
        cuda.syncthreads()
        if tid < num_heads:
            new_max = max(running[tid], stats[tid])
            running[MAX_GROUP + tid] = running[MAX_GROUP + tid] * math.exp(running[tid] - new_max) + stats[MAX_GROUP + tid] * math.exp(
                stats[tid] - new_max
            )
            running[tid] = new_max
        cuda.syncthreads()
    for item in range(tid, num_heads * head_size, TILE):
        g, dim = item // head_size, item % head_size
        out[token, first_head + g, dim] = acc[item] / running[MAX_GROUP + g]


def _head_grouping(num_heads: int, num_kv_heads: int, head_size: int) -> tuple[int, int]:
    """(query heads per block, blocks per KV head), after checking the shapes the kernels support."""
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if head_size > MAX_HEAD_SIZE:
        raise ValueError(f"head_size {head_size} exceeds the kernels' limit of {MAX_HEAD_SIZE}")
    group = num_heads // num_kv_heads
    blocks_per_kv_head = -(-group // MAX_GROUP)
    return -(-group // blocks_per_kv_head), blocks_per_kv_head


def _configured(kernel, grid, block: int, stream):
    """``kernel[grid, block, stream]`` without numba's warning that a grid of fewer than 128 blocks
    under-uses the GPU: small grids are this design's at small batches (a block per sequence, KV head
    group and context chunk: a batch-1 decode of a short context is a few blocks)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Grid size .* low occupancy")
        return kernel[grid, block, stream]


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Store ``key``/``value`` [T, kv_heads, head_size] at their slots (a negative slot is skipped)."""
    if key.shape[0] == 0:
        return
    launch = LaunchContext(key, value, k_cache, v_cache, slot_mapping)
    arrays = [device_array(a) for a in (key, value, k_cache, v_cache, slot_mapping)]
    _configured(_write_kv_kernel, key.shape[0], TILE, launch.stream)(*arrays)


def paged_decode_attention(out, query, k_cache, v_cache, block_tables, context_lens, scale: float) -> None:
    """One query token per sequence [B, heads, head_size] over its ``context_lens[b]`` cached tokens."""
    batch, num_heads, head_size = query.shape
    if batch == 0:
        return
    heads_per_block, blocks_per_kv_head = _head_grouping(num_heads, k_cache.shape[2], head_size)
    launch = LaunchContext(out, query, k_cache, v_cache, block_tables, context_lens)
    max_context_len = block_tables.shape[1] * k_cache.shape[1]
    num_splits = max(1, -(-max_context_len // TOKENS_PER_SPLIT))
    partial_acc = launch.empty((batch, num_heads, num_splits, head_size))
    partial_stats = launch.empty((batch, num_heads, num_splits, 2))
    arrays = [device_array(a) for a in (query, k_cache, v_cache, block_tables, context_lens)]
    grid = (batch, k_cache.shape[2] * blocks_per_kv_head, num_splits)
    _configured(_decode_split_kernel, grid, TILE, launch.stream)(
        partial_acc, partial_stats, *arrays, np.float32(scale), heads_per_block, blocks_per_kv_head
    )
    merge = _configured(_merge_splits_kernel, (batch, num_heads), min(TILE, head_size), launch.stream)
    merge(device_array(out), partial_acc, partial_stats, arrays[-1])


def paged_prefill_attention(out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale: float) -> None:
    """Chunks of query tokens [T, heads, head_size]; token i of sequence b sits at position
    ``context_lens[b] - q_len_b + i`` and attends causally to every position up to its own."""
    num_tokens, num_heads, head_size = query.shape
    if num_tokens == 0:
        return
    heads_per_block, blocks_per_kv_head = _head_grouping(num_heads, k_cache.shape[2], head_size)
    launch = LaunchContext(out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens)
    arrays = [device_array(a) for a in (out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens)]
    grid = (num_tokens, k_cache.shape[2] * blocks_per_kv_head)
    _configured(_prefill_kernel, grid, TILE, launch.stream)(*arrays, np.float32(scale), heads_per_block, blocks_per_kv_head)
