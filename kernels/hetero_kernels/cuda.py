"""Numba CUDA paged attention, reading keys and values in place through the block tables.

A thread block serves one KV head and the query heads that share it (up to
``MAX_GROUP`` of them, so every key and value is read once per group) over a
range of context positions, in one pass with an online softmax:

- a *row group* of neighbouring threads shares a key or value row. The
  cache is read in 32-bit words (two 16-bit elements, or one float32); a row
  group has as many lanes as a row has words over ``WORDS_PER_LANE``
  (rounded up to a power of two, at most a warp), and lane ``l`` of ``n``
  takes words ``l, l + n, ...``: a float16 row of 64 has 32 words, 8 lanes,
  and a warp's load covers whole 32-byte sectors of 4 rows;
- the block's row groups take consecutive positions; each loads
  ``ROWS_PER_STEP`` key rows and as many value rows before using any (the
  loads are in flight together), sums its partial dot products by shuffles
  within the row group, then updates its running maximum, exp-sum and
  weighted value sums, which stay in registers with the queries;
- at the end the row groups' states merge, by shuffles within a warp, then
  through shared memory across warps.

The kernels are specialised per launch (compile-time constants): the heads a
block serves, the words each lane reads of a row, and how a word holds its
elements, so every per-thread array has a constant size and stays in
registers. Positions advance block by block (no division per position), with
unsigned indices in the inner loops.

A float16 word is widened with integer operations: its halves' bits, shifted
into a float32's, are the value times 2**-112 (exactly, subnormals too), and
the finished dot product, or the softmax weight that multiplies the value, is
scaled back by 2**112. Infinities and NaNs in a float16 cache read as large
finite numbers.

Decode is split-K ("flash-decoding"): a block per (sequence, head group,
chunk), and a second kernel merges the chunks. The chunk length is chosen per
launch from the batch and the block-table width (never from the lengths'
values, so a captured graph stays valid): short enough that a small batch
still spreads over the GPU's multiprocessors, at most ``TOKENS_PER_SPLIT``.
Prefill gives a block to each (query token, head group), over every position
the token sees.

Inputs may be numba device arrays, numpy arrays (copied by numba) or torch
CUDA tensors (launched on torch's current stream, scratch from torch's
allocator: no host sync). Caches, queries and outputs may be float16,
float32 or bfloat16 (a torch bfloat16 tensor, or a ``uint16``/``int16``
array of bfloat16 bits); everything accumulates in float32, and a bfloat16
output is rounded to nearest even. ``context_lens`` must be at least 1, and
``block_tables`` wide enough for the longest context (its width bounds the
number of decode chunks, so no length needs to be read back to the host).

On Numba's CUDA simulator the shuffles are exchanges through shared memory.
The module constants are read when a kernel is compiled: change them (with
:func:`configure`) before the first launch.
"""

from __future__ import annotations

import math

import numpy as np
from numba import config as numba_config
from numba import cuda, float32, int32, uint32, uint64

from hetero_kernels.cuda_elements import narrow, widen
from hetero_kernels.cuda_interop import LaunchContext, configured, device_array

TILE = 128  # threads per block (a power of two)
WORDS_PER_LANE = 4  # the most 32-bit words of a row a lane reads, where a warp's lanes suffice
ROWS_PER_STEP = 4  # rows each row group loads before using them
TOKENS_PER_SPLIT = 256  # the longest decode chunk of context positions
MIN_TOKENS_PER_SPLIT = 64  # the shortest chunk a decode launch picks
MAX_GROUP = 4  # query heads per block (more share a KV head: several blocks serve them)
MAX_HEAD_SIZE = 256
MAX_SHARED_BYTES = 48 * 1024  # static shared memory per thread block
BLOCKS_PER_MULTIPROCESSOR = 2  # decode chunks are shortened until the grid has this many blocks per SM
WARP_SIZE = 32
MERGE_DIMS = -(-MAX_HEAD_SIZE // TILE)  # dims a thread of the merge kernel sums (kept in step by configure())

HALF_UNSCALE = float(2.0**112)  # a float16's bits shifted into a float32's are its value times 2**-112


def _warp_lanes(tile: int) -> int:
    return min(WARP_SIZE, tile)


def _shared_bytes(tile: int, max_group: int, max_head_size: int) -> int:
    """The kernels' shared arrays, in bytes: each warp's merged state, and the simulator's exchange slots."""
    warps = tile // _warp_lanes(tile)
    return 4 * (warps * max_group * (max_head_size + 2) + tile)


def configure(
    *,
    tile: int | None = None,
    words_per_lane: int | None = None,
    rows_per_step: int | None = None,
    tokens_per_split: int | None = None,
    min_tokens_per_split: int | None = None,
    max_group: int | None = None,
    max_head_size: int | None = None,
) -> None:
    """Change the launch shape (the simulator tests use a small one); what is not given stays.

    Only before the first launch: on a GPU the constants are compiled into the kernels.
    """
    global TILE, WORDS_PER_LANE, ROWS_PER_STEP, TOKENS_PER_SPLIT, MIN_TOKENS_PER_SPLIT, MAX_GROUP, MAX_HEAD_SIZE
    global MERGE_DIMS
    if _KERNELS or getattr(_merge_splits_kernel, "overloads", None) or getattr(_write_kv_kernel, "overloads", None):
        raise RuntimeError("hetero_kernels.cuda.configure() must run before the first kernel launch")
    tile = TILE if tile is None else tile
    words_per_lane = WORDS_PER_LANE if words_per_lane is None else words_per_lane
    rows_per_step = ROWS_PER_STEP if rows_per_step is None else rows_per_step
    tokens_per_split = TOKENS_PER_SPLIT if tokens_per_split is None else tokens_per_split
    min_tokens_per_split = MIN_TOKENS_PER_SPLIT if min_tokens_per_split is None else min_tokens_per_split
    max_group = MAX_GROUP if max_group is None else max_group
    max_head_size = MAX_HEAD_SIZE if max_head_size is None else max_head_size
    if tile < 1 or tile > 1024 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two up to 1024 (threads per block), got {tile}")
    if words_per_lane < 1:
        raise ValueError(f"words_per_lane must be at least 1, got {words_per_lane}")
    if tile < WARP_SIZE and not numba_config.ENABLE_CUDASIM:
        raise ValueError(f"on a GPU the tile must be at least a warp ({WARP_SIZE} threads), got {tile}")
    if rows_per_step < 1:
        raise ValueError(f"rows_per_step must be at least 1, got {rows_per_step}")
    if not 1 <= min_tokens_per_split <= tokens_per_split:
        raise ValueError(
            f"min_tokens_per_split must be between 1 and tokens_per_split ({tokens_per_split}),"
            f" got {min_tokens_per_split}"
        )
    shared = _shared_bytes(tile, max_group, max_head_size)
    if shared > MAX_SHARED_BYTES:
        raise ValueError(
            f"this launch shape needs {shared} bytes of shared memory per block; the limit is {MAX_SHARED_BYTES}"
        )
    TILE, WORDS_PER_LANE, ROWS_PER_STEP = tile, words_per_lane, rows_per_step
    MERGE_DIMS = -(-max_head_size // tile)
    TOKENS_PER_SPLIT, MIN_TOKENS_PER_SPLIT, MAX_GROUP, MAX_HEAD_SIZE = (
        tokens_per_split,
        min_tokens_per_split,
        max_group,
        max_head_size,
    )


# ---------------------------------------------------------------------- lane exchanges and words

if numba_config.ENABLE_CUDASIM:

    @cuda.jit(device=True)
    def _exchange(value, mask, slots, tid):
        """The value of thread ``tid ^ mask`` (the simulator has no shuffles: through shared memory)."""
        cuda.syncthreads()
        slots[tid] = value
        cuda.syncthreads()
        return slots[tid ^ mask]

    @cuda.jit(device=True)
    def _fast_exp(x):
        return math.exp(x)

    @cuda.jit(device=True)
    def _as_float(bits):
        return np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]

else:
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _exchange(value, mask, slots, tid):
        """The value of thread ``tid ^ mask``, within its warp."""
        return cuda.shfl_xor_sync(0xFFFFFFFF, value, mask)

    @cuda.jit(device=True)
    def _fast_exp(x):
        """CUDA's fast exp (``__expf``): within 2 + 1.16|x| ulp, a few millionths for the softmax's arguments."""
        return libdevice.fast_expf(x)

    @cuda.jit(device=True)
    def _as_float(bits):
        return libdevice.int_as_float(int32(bits))


@cuda.jit(device=True)
def _float32_in_word(word, e):
    """A word holding one float32, as float32."""
    return _as_float(uint32(word))


@cuda.jit(device=True)
def _bfloat16_in_word(word, e):
    """Element ``e`` of a word of two bfloat16s, as float32 (exact)."""
    bits = uint32(word)
    if e == 0:
        return _as_float(bits << uint32(16))
    return _as_float(bits & uint32(0xFFFF0000))


@cuda.jit(device=True)
def _float16_in_word(word, e):
    """Element ``e`` of a word of two float16s, as float32 times 2**-112 (exact)."""
    bits = uint32(word)
    if e == 0:
        return _as_float(((bits & uint32(0x8000)) << uint32(16)) | ((bits & uint32(0x7FFF)) << uint32(13)))
    return _as_float((bits & uint32(0x80000000)) | ((bits & uint32(0x7FFF0000)) >> uint32(3)))


# ---------------------------------------------------------------------- attention kernels

_KERNELS: dict[tuple, tuple] = {}


def _attention_kernels(group: int, lanes: int, words_per_lane: int, per_word: int, decode) -> tuple:
    """(decode split kernel, prefill kernel) for blocks of ``group`` query heads, where ``lanes`` threads
    share a row, each reading ``words_per_lane`` of its words, and a word holds ``per_word`` elements (read by
    ``decode``; a float16's value comes times 2**-112, and is scaled back)."""
    key = (group, lanes, words_per_lane, per_word, decode)
    if key in _KERNELS:
        return _KERNELS[key]
    steps, tile = ROWS_PER_STEP, TILE
    row_groups, warp_lanes = TILE // lanes, _warp_lanes(TILE)
    warps, max_head = TILE // warp_lanes, MAX_HEAD_SIZE
    state = group * words_per_lane * per_word  # a lane's queries, and its weighted value sums
    words_per_step = steps * words_per_lane
    unscale = np.float32(HALF_UNSCALE if decode is _float16_in_word else 1.0)
    state_shared, stats_shared = warps * group * max_head, warps * group * 2
    shared_size, step_scores = state_shared + stats_shared + tile, steps * group  # array sizes: single constants

    @cuda.jit(device=True)
    def attend(query, token, first_head, num_heads, scale, keys, values, table, kv_head, start, end, shared, tid):
        """Leave in ``shared`` the running maximum, exp-sum and weighted value sums of heads
        ``first_head ..`` over positions [start, end), per warp: head ``g``'s sums at
        ``(w * group + g) * max_head + dim``, its maximum and sum at ``state_shared + 2 * (w * group + g)``."""
        lane, row_group = tid % lanes, tid // lanes
        block_size, head = keys.shape[1], uint64(kv_head)
        words = uint64(keys.shape[3])
        head_size = query.shape[2]
        slots = shared[state_shared + stats_shared :]

        q = cuda.local.array(state, float32)
        for g in range(group):
            for j in range(words_per_lane):
                for e in range(per_word):
                    dim = (lane + j * lanes) * per_word + e
                    value = float32(0.0)
                    if g < num_heads and dim < head_size:
                        value = widen(query[token, first_head + g, dim]) * scale
                    q[(g * words_per_lane + j) * per_word + e] = value
        acc = cuda.local.array(state, float32)
        for i in range(state):
            acc[i] = 0.0
        best = cuda.local.array(group, float32)
        total = cuda.local.array(group, float32)
        for g in range(group):
            best[g] = -math.inf
            total[g] = 0.0

        position = start + row_group
        block_index, offset = position // block_size, position % block_size
        step_blocks, step_offset = row_groups // block_size, row_groups % block_size
        k_words = cuda.local.array(words_per_step, uint32)
        v_words = cuda.local.array(words_per_step, uint32)
        scores = cuda.local.array(step_scores, float32)
        for _ in range(0, end - start, row_groups * steps):
            for t in range(steps):
                valid = position < end
                block, row = uint64(0), uint64(offset)
                if valid:
                    block = uint64(table[block_index])
                for j in range(words_per_lane):
                    word = uint64(lane + j * lanes)
                    k_word, v_word = uint32(0), uint32(0)
                    if valid and word < words:
                        k_word, v_word = uint32(keys[block, row, head, word]), uint32(values[block, row, head, word])
                    k_words[t * words_per_lane + j] = k_word
                    v_words[t * words_per_lane + j] = v_word
                position += row_groups
                offset += step_offset
                block_index += step_blocks
                if offset >= block_size:
                    offset -= block_size
                    block_index += 1
            for t in range(steps):
                dots = cuda.local.array(group, float32)
                for g in range(group):
                    dots[g] = 0.0
                for j in range(words_per_lane):
                    for e in range(per_word):
                        element = decode(k_words[t * words_per_lane + j], e)
                        for g in range(group):
                            dots[g] += q[(g * words_per_lane + j) * per_word + e] * element
                mask = 1
                while mask < lanes:
                    for g in range(group):
                        dots[g] += _exchange(dots[g], mask, slots, tid)
                    mask *= 2
                row_position = position - (steps - t) * row_groups
                for g in range(group):
                    scores[t * group + g] = dots[g] * unscale if row_position < end else -math.inf
            for g in range(group):
                step_best = best[g]
                for t in range(steps):
                    step_best = max(step_best, scores[t * group + g])
                if step_best != -math.inf:
                    correction = _fast_exp(best[g] - step_best)
                    best[g] = step_best
                    total[g] *= correction
                    for i in range(words_per_lane * per_word):
                        acc[g * words_per_lane * per_word + i] *= correction
                    for t in range(steps):
                        weight = _fast_exp(scores[t * group + g] - step_best)
                        total[g] += weight
                        scores[t * group + g] = weight * unscale
                else:  # none of this step's rows is in the range
                    for t in range(steps):
                        scores[t * group + g] = 0.0
            for t in range(steps):
                for j in range(words_per_lane):
                    for e in range(per_word):
                        element = decode(v_words[t * words_per_lane + j], e)
                        for g in range(group):
                            acc[(g * words_per_lane + j) * per_word + e] += scores[t * group + g] * element

        # Merge the row groups of each warp, then write each warp's state.
        mask = lanes
        while mask < warp_lanes:
            for g in range(group):
                other_best = _exchange(best[g], mask, slots, tid)
                other_total = _exchange(total[g], mask, slots, tid)
                merged = max(best[g], other_best)
                mine, theirs = float32(0.0), float32(0.0)
                if merged != -math.inf:
                    mine, theirs = _fast_exp(best[g] - merged), _fast_exp(other_best - merged)
                total[g] = total[g] * mine + other_total * theirs
                best[g] = merged
                for i in range(words_per_lane * per_word):
                    index = g * words_per_lane * per_word + i
                    acc[index] = acc[index] * mine + _exchange(acc[index], mask, slots, tid) * theirs
            mask *= 2
        warp = tid // warp_lanes
        if tid % warp_lanes < lanes:
            for g in range(group):
                for j in range(words_per_lane):
                    for e in range(per_word):
                        dim = (lane + j * lanes) * per_word + e
                        if dim < head_size:
                            shared[(warp * group + g) * max_head + dim] = acc[(g * words_per_lane + j) * per_word + e]
                if lane == 0:
                    shared[state_shared + 2 * (warp * group + g)] = best[g]
                    shared[state_shared + 2 * (warp * group + g) + 1] = total[g]
        cuda.syncthreads()

    @cuda.jit(device=True)
    def merged_warps(shared, g, dim):
        """Head ``g``'s (maximum, exp-sum, weighted sum at ``dim``) over the block's warps."""
        best = float32(-math.inf)
        for w in range(warps):
            best = max(best, shared[state_shared + 2 * (w * group + g)])
        total, acc = float32(0.0), float32(0.0)
        if best != -math.inf:
            for w in range(warps):
                weight = _fast_exp(shared[state_shared + 2 * (w * group + g)] - best)
                total += shared[state_shared + 2 * (w * group + g) + 1] * weight
                acc += shared[(w * group + g) * max_head + dim] * weight
        return best, total, acc

    @cuda.jit
    def decode_split(
        partial_acc,
        partial_stats,
        query,
        keys,
        values,
        block_tables,
        context_lens,
        scale,
        blocks_per_kv_head,
        split_len,
    ):
        b, split, tid = cuda.blockIdx.x, cuda.blockIdx.z, cuda.threadIdx.x
        start = split * split_len
        length = context_lens[b]
        if start >= length:
            return
        shared = cuda.shared.array(shared_size, float32)
        kv_head, first_head, num_heads = _head_group(
            query.shape[1], keys.shape[2], group, blocks_per_kv_head, cuda.blockIdx.y
        )
        end = min(length, start + split_len)
        attend(query, b, first_head, num_heads, scale, keys, values, block_tables[b], kv_head, start, end, shared, tid)
        head_size = query.shape[2]
        for item in range(tid, num_heads * head_size, tile):
            g, dim = item // head_size, item % head_size
            best, total, acc = merged_warps(shared, g, dim)
            partial_acc[b, first_head + g, split, dim] = acc
            if dim == 0:
                partial_stats[b, first_head + g, split, 0] = best
                partial_stats[b, first_head + g, split, 1] = total

    @cuda.jit
    def prefill(
        out,
        query,
        keys,
        values,
        block_tables,
        query_start_loc,
        context_lens,
        scale,
        blocks_per_kv_head,
    ):
        token, tid = cuda.blockIdx.x, cuda.threadIdx.x
        shared = cuda.shared.array(shared_size, float32)
        kv_head, first_head, num_heads = _head_group(
            query.shape[1], keys.shape[2], group, blocks_per_kv_head, cuda.blockIdx.y
        )
        b = _sequence_of(query_start_loc, token)
        query_len = query_start_loc[b + 1] - query_start_loc[b]
        visible = context_lens[b] - query_len + (token - query_start_loc[b]) + 1
        attend(
            query, token, first_head, num_heads, scale, keys, values, block_tables[b], kv_head, 0, visible, shared, tid
        )
        head_size = query.shape[2]
        for item in range(tid, num_heads * head_size, tile):
            g, dim = item // head_size, item % head_size
            _, total, acc = merged_warps(shared, g, dim)
            out[token, first_head + g, dim] = narrow(out, acc / total)

    _KERNELS[key] = (decode_split, prefill)
    return decode_split, prefill


@cuda.jit(device=True)
def _head_group(num_heads, num_kv_heads, heads_per_block, blocks_per_kv_head, y):
    """(kv head, first query head, number of query heads) served by grid row ``y``."""
    group = num_heads // num_kv_heads
    kv_head = y // blocks_per_kv_head
    first_head = kv_head * group + (y % blocks_per_kv_head) * heads_per_block
    return kv_head, first_head, min(heads_per_block, (kv_head + 1) * group - first_head)


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


@cuda.jit(device=True)
def _block_reduce(scratch, value, tid, use_max):
    """The maximum (or sum) of every thread's ``value``, for every thread of the block."""
    scratch[tid] = value
    cuda.syncthreads()
    stride = TILE // 2
    while stride > 0:
        if tid < stride:
            other = scratch[tid + stride]
            scratch[tid] = max(scratch[tid], other) if use_max else scratch[tid] + other
        cuda.syncthreads()
        stride //= 2
    result = scratch[0]
    cuda.syncthreads()
    return result


@cuda.jit
def _merge_splits_kernel(out, partial_acc, partial_stats, context_lens, split_len):
    """A block per (sequence, head): the chunks' maxima, then their weights ``TILE`` chunks at a time (in
    shared memory), each weighted sum split over ``parts`` of the block's threads, whose loads are in
    flight together."""
    b, head, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    num_splits = (context_lens[b] + split_len - 1) // split_len
    scratch = cuda.shared.array(TILE, float32)
    weights = cuda.shared.array(TILE, float32)
    sums = cuda.shared.array(TILE, float32)
    best = float32(-math.inf)
    for split in range(tid, num_splits, TILE):
        best = max(best, partial_stats[b, head, split, 0])
    best = _block_reduce(scratch, best, tid, True)
    head_size = out.shape[2]
    parts, part, first_dim, dim_step = 1, 0, tid, TILE  # heads wider than the tile: dims tid, tid + TILE, ...
    if head_size <= TILE:  # else each dim's chunks are split between the threads of ``parts`` parts
        parts, part, first_dim, dim_step = TILE // head_size, tid // head_size, tid % head_size, head_size
    acc = cuda.local.array(MERGE_DIMS, float32)
    for i in range(MERGE_DIMS):
        acc[i] = 0.0
    total = float32(0.0)
    for first in range(0, num_splits, TILE):
        weight = float32(0.0)
        if first + tid < num_splits:
            weight = math.exp(partial_stats[b, head, first + tid, 0] - best)
            total += partial_stats[b, head, first + tid, 1] * weight
        weights[tid] = weight
        cuda.syncthreads()
        count = min(TILE, num_splits - first)
        if part < parts:
            for i in range(MERGE_DIMS):
                dim = first_dim + i * dim_step
                if dim < head_size:
                    a0, a1, a2, a3 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
                    j = part
                    while j + 3 * parts < count:
                        a0 += partial_acc[b, head, first + j, dim] * weights[j]
                        a1 += partial_acc[b, head, first + j + parts, dim] * weights[j + parts]
                        a2 += partial_acc[b, head, first + j + 2 * parts, dim] * weights[j + 2 * parts]
                        a3 += partial_acc[b, head, first + j + 3 * parts, dim] * weights[j + 3 * parts]
                        j += 4 * parts
                    while j < count:
                        a0 += partial_acc[b, head, first + j, dim] * weights[j]
                        j += parts
                    acc[i] += (a0 + a1) + (a2 + a3)
        cuda.syncthreads()
    total = _block_reduce(scratch, total, tid, False)
    if parts > 1:
        if part < parts:
            sums[tid] = acc[0]
        cuda.syncthreads()
        if tid < head_size:
            value = float32(0.0)
            for p in range(parts):
                value += sums[p * head_size + tid]
            out[b, head, tid] = narrow(out, value / total)
    elif part == 0:
        for i in range(MERGE_DIMS):
            dim = first_dim + i * dim_step
            if dim < head_size:
                out[b, head, dim] = narrow(out, acc[i] / total)


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


def _words(cache, head_size: int) -> tuple:
    """(the cache as the unsigned words the kernels read, elements a word, their reader):
    two 16-bit elements a 32-bit word where the head size is even, else one a word."""
    array = device_array(cache)
    if array.dtype.itemsize == 4:
        return array.view(np.uint32), 1, _float32_in_word
    reader = _float16_in_word if array.dtype == np.float16 else _bfloat16_in_word
    if head_size % 2:
        return array.view(np.uint16), 1, reader
    return array.view(np.uint32), 2, reader


def _lanes_per_row(words: int) -> int:
    """Threads sharing a row of ``words`` words: ``words / WORDS_PER_LANE`` rounded up to a power of two, at most
    a warp."""
    wanted = -(-words // WORDS_PER_LANE)
    return min(_warp_lanes(TILE), 1 << (wanted - 1).bit_length())


def _prepared(query, k_cache, v_cache) -> tuple:
    """(kernels, keys, values, blocks per KV head) for a launch over these caches."""
    num_heads, head_size = query.shape[1], query.shape[2]
    heads_per_block, blocks_per_kv_head = _head_grouping(num_heads, k_cache.shape[2], head_size)
    keys, per_word, decode = _words(k_cache, head_size)
    values = _words(v_cache, head_size)[0]
    words = keys.shape[3]
    lanes = _lanes_per_row(words)
    kernels = _attention_kernels(heads_per_block, lanes, -(-words // lanes), per_word, decode)
    return kernels, keys, values, blocks_per_kv_head


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
    (decode_split, _), keys, values, blocks_per_kv_head = _prepared(query, k_cache, v_cache)
    launch = LaunchContext(out, query, k_cache, v_cache, block_tables, context_lens)
    block_groups = k_cache.shape[2] * blocks_per_kv_head
    max_context_len = block_tables.shape[1] * k_cache.shape[1]
    split_len = split_length(batch, block_groups, max_context_len, _multiprocessors())
    num_splits = max(1, -(-max_context_len // split_len))
    partial_acc = launch.empty((batch, num_heads, num_splits, head_size))
    partial_stats = launch.empty((batch, num_heads, num_splits, 2))
    arrays = [device_array(a) for a in (query, block_tables, context_lens)]
    configured(decode_split, (batch, block_groups, num_splits), TILE, launch.stream)(
        partial_acc,
        partial_stats,
        arrays[0],
        keys,
        values,
        *arrays[1:],
        np.float32(scale),
        blocks_per_kv_head,
        split_len,
    )
    merge = configured(_merge_splits_kernel, (batch, num_heads), TILE, launch.stream)
    merge(device_array(out), partial_acc, partial_stats, arrays[-1], split_len)


def paged_prefill_attention(
    out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale: float
) -> None:
    """Chunks of query tokens [T, heads, head_size]; token i of sequence b sits at position
    ``context_lens[b] - q_len_b + i`` and attends causally to every position up to its own."""
    num_tokens = query.shape[0]
    if num_tokens == 0:
        return
    (_, prefill), keys, values, blocks_per_kv_head = _prepared(query, k_cache, v_cache)
    launch = LaunchContext(out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens)
    arrays = [device_array(a) for a in (out, query, block_tables, query_start_loc, context_lens)]
    grid = (num_tokens, k_cache.shape[2] * blocks_per_kv_head)
    configured(prefill, grid, TILE, launch.stream)(
        arrays[0], arrays[1], keys, values, *arrays[2:], np.float32(scale), blocks_per_kv_head
    )
