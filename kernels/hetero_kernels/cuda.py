"""Numba CUDA paged attention, reading keys and values in place through the block tables.

A thread block serves one KV head and the query heads that share it (up to
``MAX_GROUP`` of them, so every key and value is read once per group) over a
chunk of context positions:

1. scores: ``LANES_PER_KEY`` neighbouring threads share one position's key
   row (each reads every ``LANES_PER_KEY``-th dimension, so a warp reads a few
   whole rows at once), and their partial dot products are summed through
   shared memory;
2. the chunk's maximum and exp-sum per head, by tree reductions;
3. values: ``ROW_LANES`` threads (a warp) share one position's value row, a
   dimension or more each, coalesced; ``ROWS_AT_ONCE`` rows go at once, and
   their partial sums are added in shared memory.

Each thread walks its positions block by block (no division per position).

Decode is split-K ("flash-decoding"): a block per (sequence, head group,
chunk), and a second kernel merges the chunks. The chunk length is chosen per
launch from the batch and the block-table width (never from the lengths'
values, so a captured graph stays valid): short enough that a small batch
still spreads over the GPU's multiprocessors, at most ``TOKENS_PER_SPLIT``.
Prefill gives a block to each (query token, head group) and folds its chunks
together with an online softmax.

Inputs may be numba device arrays, numpy arrays (copied by numba) or torch
CUDA tensors (launched on torch's current stream, scratch from torch's
allocator: no host sync). Caches, queries and outputs may be float16,
float32 or bfloat16 (a torch bfloat16 tensor, or a ``uint16``/``int16``
array of bfloat16 bits); everything accumulates in float32, and a bfloat16
output is rounded to nearest even. ``context_lens`` must be at least 1, and
``block_tables`` wide enough for the longest context (its width bounds the
number of decode chunks, so no length needs to be read back to the host).

The module constants are read when a kernel is compiled (on the simulator,
when it runs): change them before the first launch.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, uint64

from hetero_kernels.cuda_elements import narrow, widen
from hetero_kernels.cuda_interop import LaunchContext, configured, device_array

TILE = 128  # threads per block (a power of two)
TOKENS_PER_SPLIT = 256  # the longest chunk of context positions
MIN_TOKENS_PER_SPLIT = 64  # the shortest chunk a decode launch picks
LANES_PER_KEY = 4  # threads sharing one key row in the score pass
ROW_LANES = 32  # threads sharing one value row in the value pass (a warp)
MAX_GROUP = 4  # query heads per block (more share a KV head: several blocks serve them)
MAX_HEAD_SIZE = 256
MAX_SHARED_BYTES = 48 * 1024  # static shared memory per thread block
BLOCKS_PER_MULTIPROCESSOR = 2  # decode chunks are shortened until the grid has this many blocks per SM

# Shared and local array sizes must be single compile-time constants: kept in step by configure().
ROWS_AT_ONCE = TILE // ROW_LANES
KEYS_AT_ONCE = TILE // LANES_PER_KEY
DIMS_PER_LANE = -(-MAX_HEAD_SIZE // ROW_LANES)
_QUERY_SIZE = MAX_GROUP * MAX_HEAD_SIZE
_SCORES_SIZE = MAX_GROUP * TOKENS_PER_SPLIT
_SCRATCH_SIZE = MAX_GROUP * TILE
_STATS_SIZE = 2 * MAX_GROUP
_ROWS_SIZE = ROWS_AT_ONCE * _QUERY_SIZE
_ACC_SIZE = MAX_GROUP * DIMS_PER_LANE


def _prefill_shared_bytes(tile: int, tokens_per_split: int, row_lanes: int, max_group: int, max_head_size: int) -> int:
    """The prefill kernel's shared arrays (the decode kernel's are a subset), in bytes."""
    rows_at_once = tile // row_lanes
    floats = (
        (2 + rows_at_once) * max_group * max_head_size + max_group * tokens_per_split + max_group * tile + 4 * max_group
    )
    return 4 * floats


def configure(
    *,
    tile: int | None = None,
    tokens_per_split: int | None = None,
    min_tokens_per_split: int | None = None,
    lanes_per_key: int | None = None,
    row_lanes: int | None = None,
    max_group: int | None = None,
    max_head_size: int | None = None,
) -> None:
    """Change the launch shape (the simulator tests use a small one); what is not given stays.

    Only before the first launch: on a GPU the constants are compiled into the kernels.
    """
    global TILE, TOKENS_PER_SPLIT, MIN_TOKENS_PER_SPLIT, LANES_PER_KEY, ROW_LANES, MAX_GROUP, MAX_HEAD_SIZE
    global \
        ROWS_AT_ONCE, \
        KEYS_AT_ONCE, \
        DIMS_PER_LANE, \
        _QUERY_SIZE, \
        _SCORES_SIZE, \
        _SCRATCH_SIZE, \
        _STATS_SIZE, \
        _ROWS_SIZE, \
        _ACC_SIZE
    if any(
        getattr(kernel, "overloads", None)
        for kernel in (_decode_split_kernel, _merge_splits_kernel, _prefill_kernel, _write_kv_kernel)
    ):
        raise RuntimeError("hetero_kernels.cuda.configure() must run before the first kernel launch")
    tile = TILE if tile is None else tile
    tokens_per_split = TOKENS_PER_SPLIT if tokens_per_split is None else tokens_per_split
    min_tokens_per_split = MIN_TOKENS_PER_SPLIT if min_tokens_per_split is None else min_tokens_per_split
    lanes_per_key = LANES_PER_KEY if lanes_per_key is None else lanes_per_key
    row_lanes = min(ROW_LANES, tile) if row_lanes is None else row_lanes
    max_group = MAX_GROUP if max_group is None else max_group
    max_head_size = MAX_HEAD_SIZE if max_head_size is None else max_head_size
    if tile < 1 or tile > 1024 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two up to 1024 (threads per block), got {tile}")
    if lanes_per_key < 1 or tile % lanes_per_key:
        raise ValueError(f"lanes_per_key must divide the tile ({tile} threads), got {lanes_per_key}")
    if row_lanes < 1 or tile % row_lanes:
        raise ValueError(f"row_lanes must divide the tile ({tile} threads), got {row_lanes}")
    if not 1 <= min_tokens_per_split <= tokens_per_split:
        raise ValueError(
            f"min_tokens_per_split must be between 1 and tokens_per_split ({tokens_per_split}),"
            f" got {min_tokens_per_split}"
        )
    shared = _prefill_shared_bytes(tile, tokens_per_split, row_lanes, max_group, max_head_size)
    if shared > MAX_SHARED_BYTES:
        raise ValueError(
            f"this launch shape needs {shared} bytes of shared memory per block; the limit is {MAX_SHARED_BYTES}"
        )
    TILE, TOKENS_PER_SPLIT, MIN_TOKENS_PER_SPLIT, LANES_PER_KEY = (
        tile,
        tokens_per_split,
        min_tokens_per_split,
        lanes_per_key,
    )
    ROW_LANES, MAX_GROUP, MAX_HEAD_SIZE = row_lanes, max_group, max_head_size
    ROWS_AT_ONCE, KEYS_AT_ONCE, DIMS_PER_LANE = TILE // ROW_LANES, TILE // LANES_PER_KEY, -(-MAX_HEAD_SIZE // ROW_LANES)
    _QUERY_SIZE, _SCORES_SIZE, _SCRATCH_SIZE, _STATS_SIZE = (
        MAX_GROUP * MAX_HEAD_SIZE,
        MAX_GROUP * TOKENS_PER_SPLIT,
        MAX_GROUP * TILE,
        2 * MAX_GROUP,
    )
    _ROWS_SIZE, _ACC_SIZE = ROWS_AT_ONCE * _QUERY_SIZE, MAX_GROUP * DIMS_PER_LANE


# ---------------------------------------------------------------------- device functions


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
def _chunk_scores(q_shared, k_cache, table, kv_head, start, count, scores, scratch, tid):
    """``scores[g * TOKENS_PER_SPLIT + t]`` = query ``g`` . key of position ``start + t``, for ``t < count``
    and every query row (rows past the group's heads hold zero queries).

    The inner loop indexes with unsigned integers: numba adds a negative-index
    wraparound to every signed index, which would cost more than the arithmetic.
    """
    block_size = k_cache.shape[1]
    head_size, head = uint64(k_cache.shape[3]), uint64(kv_head)
    lane, slot = tid % LANES_PER_KEY, tid // LANES_PER_KEY
    dots = cuda.local.array(MAX_GROUP, float32)
    position = start + slot
    block_index, offset = position // block_size, position % block_size
    for first in range(0, count, KEYS_AT_ONCE):
        for g in range(MAX_GROUP):
            dots[g] = 0.0
        if first + slot < count:
            block, row = uint64(table[block_index]), uint64(offset)
            dim = uint64(lane)
            while dim < head_size:
                key = widen(k_cache[block, row, head, dim])
                for g in range(MAX_GROUP):
                    dots[g] += q_shared[dim + uint64(g * MAX_HEAD_SIZE)] * key
                dim += uint64(LANES_PER_KEY)
        for g in range(MAX_GROUP):
            scratch[g * TILE + tid] = dots[g]
        cuda.syncthreads()
        if lane == 0 and first + slot < count:
            for g in range(MAX_GROUP):
                total = float32(0.0)
                for other in range(LANES_PER_KEY):
                    total += scratch[g * TILE + tid + other]
                scores[g * TOKENS_PER_SPLIT + first + slot] = total
        cuda.syncthreads()
        offset += KEYS_AT_ONCE
        while offset >= block_size:
            offset -= block_size
            block_index += 1


@cuda.jit(device=True)
def _chunk_softmax(q_shared, k_cache, table, kv_head, num_heads, start, end, scores, scratch, stats, tid):
    """Softmax weights of positions [start, end) for ``num_heads`` heads.

    On return ``scores[g * TOKENS_PER_SPLIT + t]`` is ``exp(s - m_g)`` for
    position ``start + t``, ``stats[g]`` the chunk maximum ``m_g`` and
    ``stats[MAX_GROUP + g]`` the sum of the weights. ``q_shared`` holds the
    queries, already scaled, with a row of ``MAX_HEAD_SIZE`` per head.
    """
    count = end - start
    _chunk_scores(q_shared, k_cache, table, kv_head, start, count, scores, scratch, tid)
    # Per-thread values live in MAX_GROUP-long local arrays indexed only in loops
    # of constant trip count, so they can stay in registers.
    thread_max = cuda.local.array(MAX_GROUP, float32)
    for g in range(MAX_GROUP):
        thread_max[g] = -math.inf
    for t in range(tid, count, TILE):
        for g in range(MAX_GROUP):
            thread_max[g] = max(thread_max[g], scores[g * TOKENS_PER_SPLIT + t])
    for g in range(MAX_GROUP):
        if g < num_heads:
            scratch[g * TILE + tid] = thread_max[g]
    cuda.syncthreads()
    _tree_reduce(scratch, num_heads, tid, True)
    if tid < num_heads:
        stats[tid] = scratch[tid * TILE]
    cuda.syncthreads()
    thread_sum = thread_max
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
def _chunk_values(v_cache, table, kv_head, num_heads, start, count, scores, rows, tid):
    """Weighted sums of the chunk's value rows, in ``ROWS_AT_ONCE`` parts: part ``r`` (the rows
    ``r, r + ROWS_AT_ONCE, ...``) of head ``g``, dimension ``d`` at ``rows[r * _QUERY_SIZE + g * MAX_HEAD_SIZE + d]``.
    Unsigned indices in the inner loop, as in :func:`_chunk_scores`."""
    block_size = v_cache.shape[1]
    head_size, head = uint64(v_cache.shape[3]), uint64(kv_head)
    lane, part = tid % ROW_LANES, tid // ROW_LANES
    acc = cuda.local.array(_ACC_SIZE, float32)
    for i in range(_ACC_SIZE):
        acc[i] = 0.0
    position = start + part
    block_index, offset = position // block_size, position % block_size
    for t in range(part, count, ROWS_AT_ONCE):
        block, row, weight_index = uint64(table[block_index]), uint64(offset), uint64(t)
        for j in range(DIMS_PER_LANE):
            dim = uint64(lane + j * ROW_LANES)
            if dim < head_size:
                value = widen(v_cache[block, row, head, dim])
                for g in range(MAX_GROUP):
                    if g < num_heads:
                        acc[g * DIMS_PER_LANE + j] += scores[weight_index + uint64(g * TOKENS_PER_SPLIT)] * value
        offset += ROWS_AT_ONCE
        while offset >= block_size:
            offset -= block_size
            block_index += 1
    for j in range(DIMS_PER_LANE):
        dim = lane + j * ROW_LANES
        if dim < v_cache.shape[3]:
            for g in range(MAX_GROUP):
                rows[part * _QUERY_SIZE + g * MAX_HEAD_SIZE + dim] = acc[g * DIMS_PER_LANE + j]
    cuda.syncthreads()


@cuda.jit(device=True)
def _summed_rows(rows, g, dim):
    """Head ``g``'s weighted value sum at ``dim``: the parts of :func:`_chunk_values` added."""
    total = float32(0.0)
    for part in range(ROWS_AT_ONCE):
        total += rows[part * _QUERY_SIZE + g * MAX_HEAD_SIZE + dim]
    return total


@cuda.jit(device=True)
def _load_queries(q_shared, query, token, first_head, num_heads, scale, tid):
    """Scaled queries of heads ``first_head ..`` into rows of ``q_shared``; rows past ``num_heads`` are zero."""
    head_size = query.shape[2]
    for item in range(tid, MAX_GROUP * head_size, TILE):
        g, dim = item // head_size, item % head_size
        value = float32(0.0)
        if g < num_heads:
            value = widen(query[token, first_head + g, dim]) * scale
        q_shared[g * MAX_HEAD_SIZE + dim] = value
    cuda.syncthreads()


@cuda.jit(device=True)
def _head_group(num_heads, num_kv_heads, heads_per_block, blocks_per_kv_head, y):
    """(kv head, first query head, number of query heads) served by grid row ``y``."""
    group = num_heads // num_kv_heads
    kv_head = y // blocks_per_kv_head
    first_head = kv_head * group + (y % blocks_per_kv_head) * heads_per_block
    return kv_head, first_head, min(heads_per_block, (kv_head + 1) * group - first_head)


# ---------------------------------------------------------------------- kernels


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
        k_cache[block, offset, head, dim] = narrow(k_cache, widen(key[token, head, dim]))
        v_cache[block, offset, head, dim] = narrow(v_cache, widen(value[token, head, dim]))


@cuda.jit
def _decode_split_kernel(
    partial_acc,
    partial_stats,
    query,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    scale,
    heads_per_block,
    blocks_per_kv_head,
    split_len,
):
    b, split, tid = cuda.blockIdx.x, cuda.blockIdx.z, cuda.threadIdx.x
    start = split * split_len
    length = context_lens[b]
    if start >= length:
        return
    end = min(length, start + split_len)
    q_shared = cuda.shared.array(_QUERY_SIZE, float32)
    scores = cuda.shared.array(_SCORES_SIZE, float32)
    scratch = cuda.shared.array(_SCRATCH_SIZE, float32)
    stats = cuda.shared.array(_STATS_SIZE, float32)
    rows = cuda.shared.array(_ROWS_SIZE, float32)
    kv_head, first_head, num_heads = _head_group(
        query.shape[1], k_cache.shape[2], heads_per_block, blocks_per_kv_head, cuda.blockIdx.y
    )
    _load_queries(q_shared, query, b, first_head, num_heads, scale, tid)
    table = block_tables[b]
    _chunk_softmax(q_shared, k_cache, table, kv_head, num_heads, start, end, scores, scratch, stats, tid)
    _chunk_values(v_cache, table, kv_head, num_heads, start, end - start, scores, rows, tid)
    head_size = query.shape[2]
    for item in range(tid, num_heads * head_size, TILE):
        g, dim = item // head_size, item % head_size
        partial_acc[b, first_head + g, split, dim] = _summed_rows(rows, g, dim)
    if tid < num_heads:
        partial_stats[b, first_head + tid, split, 0] = stats[tid]
        partial_stats[b, first_head + tid, split, 1] = stats[MAX_GROUP + tid]


@cuda.jit
def _merge_splits_kernel(out, partial_acc, partial_stats, context_lens, split_len):
    b, head = cuda.blockIdx.x, cuda.blockIdx.y
    num_splits = (context_lens[b] + split_len - 1) // split_len
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
        out[b, head, dim] = narrow(out, acc / total)


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
def _prefill_kernel(
    out,
    query,
    k_cache,
    v_cache,
    block_tables,
    query_start_loc,
    context_lens,
    scale,
    heads_per_block,
    blocks_per_kv_head,
):
    token, tid = cuda.blockIdx.x, cuda.threadIdx.x
    q_shared = cuda.shared.array(_QUERY_SIZE, float32)
    scores = cuda.shared.array(_SCORES_SIZE, float32)
    scratch = cuda.shared.array(_SCRATCH_SIZE, float32)
    stats = cuda.shared.array(_STATS_SIZE, float32)
    rows = cuda.shared.array(_ROWS_SIZE, float32)
    running = cuda.shared.array(_STATS_SIZE, float32)  # running max, running sum per head
    acc = cuda.shared.array(_QUERY_SIZE, float32)
    kv_head, first_head, num_heads = _head_group(
        query.shape[1], k_cache.shape[2], heads_per_block, blocks_per_kv_head, cuda.blockIdx.y
    )
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
        _chunk_softmax(q_shared, k_cache, table, kv_head, num_heads, start, end, scores, scratch, stats, tid)
        _chunk_values(v_cache, table, kv_head, num_heads, start, end - start, scores, rows, tid)
        for item in range(tid, num_heads * head_size, TILE):
            g, dim = item // head_size, item % head_size
            new_max = max(running[g], stats[g])
            acc[item] = acc[item] * math.exp(running[g] - new_max) + _summed_rows(rows, g, dim) * math.exp(
                stats[g] - new_max
            )
        cuda.syncthreads()
        if tid < num_heads:
            new_max = max(running[tid], stats[tid])
            running[MAX_GROUP + tid] = running[MAX_GROUP + tid] * math.exp(running[tid] - new_max) + stats[
                MAX_GROUP + tid
            ] * math.exp(stats[tid] - new_max)
            running[tid] = new_max
        cuda.syncthreads()
    for item in range(tid, num_heads * head_size, TILE):
        g, dim = item // head_size, item % head_size
        out[token, first_head + g, dim] = narrow(out, acc[item] / running[MAX_GROUP + g])


# ---------------------------------------------------------------------- launches


def _head_grouping(num_heads: int, num_kv_heads: int, head_size: int) -> tuple[int, int]:
    """(query heads per block, blocks per KV head), after checking the shapes the kernels support."""
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if head_size > MAX_HEAD_SIZE:
        raise ValueError(f"head_size {head_size} exceeds the kernels' limit of {MAX_HEAD_SIZE}")
    group = num_heads // num_kv_heads
    blocks_per_kv_head = -(-group // MAX_GROUP)
    return -(-group // blocks_per_kv_head), blocks_per_kv_head


_MULTIPROCESSORS: dict[int | None, int] = {}


def _multiprocessors() -> int:
    """The current GPU's multiprocessor count (the simulator's device reports none: one)."""
    device = cuda.get_current_device()
    key = getattr(device, "id", None)
    if key not in _MULTIPROCESSORS:
        _MULTIPROCESSORS[key] = int(getattr(device, "MULTIPROCESSOR_COUNT", 1))
    return _MULTIPROCESSORS[key]


def split_length(batch: int, block_groups: int, max_context_len: int, multiprocessors: int) -> int:
    """Decode chunk length: short enough for ``BLOCKS_PER_MULTIPROCESSOR`` blocks per multiprocessor where
    the batch allows, within [MIN_TOKENS_PER_SPLIT, TOKENS_PER_SPLIT]."""
    wanted_splits = -(-BLOCKS_PER_MULTIPROCESSOR * multiprocessors // (batch * block_groups))
    length = -(-max_context_len // wanted_splits)
    return max(MIN_TOKENS_PER_SPLIT, min(TOKENS_PER_SPLIT, length))


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Store ``key``/``value`` [T, kv_heads, head_size] at their slots (a negative slot is skipped)."""
    if key.shape[0] == 0:
        return
    launch = LaunchContext(key, value, k_cache, v_cache, slot_mapping)
    arrays = [device_array(a) for a in (key, value, k_cache, v_cache, slot_mapping)]
    configured(_write_kv_kernel, key.shape[0], TILE, launch.stream)(*arrays)


def paged_decode_attention(out, query, k_cache, v_cache, block_tables, context_lens, scale: float) -> None:
    """One query token per sequence [B, heads, head_size] over its ``context_lens[b]`` cached tokens."""
    batch, num_heads, head_size = query.shape
    if batch == 0:
        return
    heads_per_block, blocks_per_kv_head = _head_grouping(num_heads, k_cache.shape[2], head_size)
    launch = LaunchContext(out, query, k_cache, v_cache, block_tables, context_lens)
    block_groups = k_cache.shape[2] * blocks_per_kv_head
    max_context_len = block_tables.shape[1] * k_cache.shape[1]
    split_len = split_length(batch, block_groups, max_context_len, _multiprocessors())
    num_splits = max(1, -(-max_context_len // split_len))
    partial_acc = launch.empty((batch, num_heads, num_splits, head_size))
    partial_stats = launch.empty((batch, num_heads, num_splits, 2))
    arrays = [device_array(a) for a in (query, k_cache, v_cache, block_tables, context_lens)]
    configured(_decode_split_kernel, (batch, block_groups, num_splits), TILE, launch.stream)(
        partial_acc, partial_stats, *arrays, np.float32(scale), heads_per_block, blocks_per_kv_head, split_len
    )
    merge = configured(_merge_splits_kernel, (batch, num_heads), min(TILE, head_size), launch.stream)
    merge(device_array(out), partial_acc, partial_stats, arrays[-1], split_len)


def paged_prefill_attention(
    out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale: float
) -> None:
    """Chunks of query tokens [T, heads, head_size]; token i of sequence b sits at position
    ``context_lens[b] - q_len_b + i`` and attends causally to every position up to its own."""
    num_tokens, num_heads, head_size = query.shape
    if num_tokens == 0:
        return
    heads_per_block, blocks_per_kv_head = _head_grouping(num_heads, k_cache.shape[2], head_size)
    launch = LaunchContext(out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens)
    arrays = [device_array(a) for a in (out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens)]
    grid = (num_tokens, k_cache.shape[2] * blocks_per_kv_head)
    configured(_prefill_kernel, grid, TILE, launch.stream)(
        *arrays, np.float32(scale), heads_per_block, blocks_per_kv_head
    )
