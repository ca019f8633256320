"""Numba CPU paged attention, reading keys and values in place through the block tables.

A decode's work item is one sequence with all its heads, over the positions
it sees; below ``SPLIT_BELOW_TOKENS`` sequences (a batch-1 decode) it is
split into one item per KV head, so both threads work. A prefill's work
item is a run of up to ``TILE_TOKENS`` query tokens of one chunk with one KV
head. Either way an item is a set of query rows (heads of a token) and the
KV heads they read, and it reads each position's cache row once, in two
passes: the scores of every position (kept in a scratch row per query row,
so the softmax needs no running rescale), then the weighted values. Both
passes hold sixteen float32 lanes per register (:mod:`hetero_kernels.simd`):
four positions' keys of a KV head (64 dimensions at a time) are read into
registers once for every query row of that head, and each value row once
for two of them. With 8 tokens and SmolLM2's three heads per KV head, 24
prefill rows share each read, where a token on its own re-read its whole
context. A bfloat16 model's queries are bfloat16 numbers: over a bfloat16
cache their scores come from :mod:`hetero_kernels.cpu_scores` instead,
bfloat16 dot products sixteen positions at a time, where the CPU has
AVX-512 BF16.

Everything accumulates in float32, reassociated, so results agree with the
float64 reference to float32 rounding, not bit for bit.

The cache rows of a sequence lie block by block wherever the allocator put
them, and by the time a layer's attention runs, its weights have pushed the
cache out of the CPU's caches. The hardware prefetcher cannot follow a
block table, so the scores pass asks for each key row ``PREFETCH_AHEAD``
positions before it reads it, and for each value row a pass before (about
a quarter faster on a cold cache). The lines are asked into the L2 cache,
not L1 (``prefetcht2``): a batch-32 decode from memory takes a quarter to a
third less time so on Zen 4 (likely because a request for L1 holds one of
its few miss buffers until the line arrives, which caps the lines in
flight). Measurements: ``docs/design/2026-11-26-cpu-attention-kernels.md``.

Items run in parallel (``prange``).

Arrays: ``query``/``out`` float32; caches float32, float16 or bfloat16.
numpy has no bfloat16, so a bfloat16 cache is passed as its raw bits, a
``uint16`` array (see :func:`~hetero_kernels.dtypes.bfloat16_bits`), and each element is widened by
a shift into the top half of a float32. Numba has no float16 type on the CPU,
so a float16 cache is read through its raw bits: 32 at a time converted as
LLVM half-precision vectors, the dimensions past the last whole 32 through a
65536-entry decode table (both exact).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from hetero_kernels import cpu_scores, host, simd
from hetero_kernels.dtypes import FLOAT16_BITS_TO_FLOAT32, NO_DECODE_TABLE, WIDEN_BFLOAT16
from hetero_kernels.elements import load

_OPTIONS = dict(fastmath=True, cache=True)
NEGLIGIBLE = np.float32(-60.0)  # scores this far under a head's maximum get weight 0
SPLIT_BELOW_TOKENS = 4
PREFETCH_AHEAD = 16  # positions
TILE_TOKENS = 8  # query tokens a prefill work item takes at once
CACHE_LINE = 64  # bytes


@intrinsic
def _power_of_two(typingctx, exponent):
    """``2.0 ** exponent`` as a float32, for an int32 ``exponent`` in -126..127 (built from its bits)."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        biased = builder.add(args[0], ir.Constant(i32, 127))
        return builder.bitcast(builder.shl(biased, ir.Constant(i32, 23)), ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def _larger(typingctx, a, b):
    """The larger of two float32 numbers (``llvm.maxnum``): unlike ``max``, whose NaN checks keep a loop
    scalar, a loop of it vectorises."""

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        return builder.call(
            host.declare(builder.module, "llvm.maxnum.f32", f32, [f32, f32]), args, fastmath=("nnan", "nsz")
        )

    return types.float32(types.float32, types.float32), codegen


@intrinsic
def _prefetch(typingctx, array, byte_offset):
    """Ask for the cache line ``byte_offset`` bytes into ``array``'s data to be brought into the L2 cache
    (a hint: it never faults)."""

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.gep(builder.bitcast(data, ir.IntType(8).as_pointer()), [args[1]])
        i32 = ir.IntType(32)
        prefetch = builder.module.declare_intrinsic(
            "llvm.prefetch", [address.type], ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32])
        )
        builder.call(
            prefetch, [address, ir.Constant(i32, 0), ir.Constant(i32, 1), ir.Constant(i32, 1)]
        )  # read, L2, data
        return context.get_dummy_value()

    return types.none(array, types.intp), codegen


@njit(inline="always", **_OPTIONS)
def _prefetch_position(cache, row, first, size):
    """Prefetch ``size`` elements from element ``first`` of ``row`` of a cache viewed as
    ``[positions, kv_heads * head_size]``."""
    start = row * cache.strides[0] + first * cache.strides[1]
    stop = start + size * cache.strides[1]
    for byte in range(start, stop, CACHE_LINE):
        _prefetch(cache, byte)
    _prefetch(cache, stop - 1)


@njit(inline="always", **_OPTIONS)
def _weight(shifted):
    """``exp(shifted)`` for a score ``shifted`` under its head's maximum (so at most 0), or 0 below
    NEGLIGIBLE, where the weight is under 1e-26 of the largest: nothing in float32, and its exp and
    products would be subnormal, which the CPU computes many times slower."""
    return _exp_in_range(max(shifted, NEGLIGIBLE)) if shifted > NEGLIGIBLE else np.float32(0.0)


@njit(inline="always", **_OPTIONS)
def exp(x):
    """``exp(x)`` in float32, ``x`` clamped to -87..88 (below, the result would be subnormal, which
    the CPU computes many times slower; above, it overflows)."""
    return _exp_in_range(min(max(x, np.float32(-87.0)), np.float32(88.0)))


@njit(inline="always", **_OPTIONS)
def _exp_in_range(x):
    """``exp(x)`` for ``x`` in -87..88.

    numpy's exp is a call per element (Numba has no vector math library here); this one is
    arithmetic, so loops over it vectorise: ``2**n * exp(r)`` with ``n`` the nearest integer to
    ``x / ln 2`` and ``exp(r)``, ``|r| <= ln 2 / 2``, by its Taylor series to ``r**6``: relative
    error under 3e-7 against float64 over the whole range."""
    n = np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
    r = (x - n * np.float32(0.693145751953125)) - n * np.float32(1.4286068203094172e-06)  # ln 2 in two parts
    series = np.float32(1.0) + r * (
        np.float32(1.0)
        + r
        * (
            np.float32(1 / 2)
            + r * (np.float32(1 / 6) + r * (np.float32(1 / 24) + r * (np.float32(1 / 120) + r * np.float32(1 / 720))))
        )
    )
    return series * _power_of_two(np.int32(n))


@njit(**_OPTIONS)
def _attend(out, query, row, k_cache, v_cache, table, num_positions, first_kv_head, num_kv_heads, scale, decode_table):
    """Attention of ``query[row]``'s heads that read KV heads ``first_kv_head ..`` (``num_kv_heads`` of
    them) over positions ``[0, num_positions)`` of the sequence with block table ``table``; written to
    the same heads of ``out[row]``."""
    head_size = k_cache.shape[3]
    group = query.shape[1] // k_cache.shape[2]
    first_head = first_kv_head * group
    q = np.empty((num_kv_heads * group, head_size), dtype=np.float32)
    for h in range(q.shape[0]):
        for d in range(head_size):
            q[h, d] = query[row, first_head + h, d]
    attended = attend_heads(q, scale, group, k_cache, v_cache, table, num_positions, first_kv_head, decode_table)
    for h in range(q.shape[0]):
        for d in range(head_size):
            out[row, first_head + h, d] = attended[h, d]


@njit(**_OPTIONS)
def attend_heads(q, scale, group, k_cache, v_cache, table, num_positions, first_kv_head, decode_table):
    """Attention ``[heads, head_size]`` (float32) of the query heads ``q`` (float32 ``[heads,
    head_size]``, ``group`` of them per KV head, reading KV heads ``first_kv_head ..``; scores scaled by
    ``scale``) over positions ``[0, num_positions)`` of the sequence with block table ``table``."""
    acc, _, sums = attend_span(q, scale, group, k_cache, v_cache, table, 0, num_positions, first_kv_head, decode_table)
    for h in range(acc.shape[0]):
        inverse = np.float32(1.0) / sums[h]
        for d in range(acc.shape[1]):
            acc[h, d] *= inverse
    return acc


@njit(**_OPTIONS)
def attend_span(q, scale, group, k_cache, v_cache, table, start, stop, first_kv_head, decode_table):
    """Attention of ``q`` (as :func:`attend_heads`) over positions ``[start, stop)``, not yet
    normalised: the weighted values ``[heads, head_size]``, the largest score of each head and the sum
    of each head's weights ``exp(score - largest)``. An empty span gives zeros and ``-inf``.

    Each position's keys (then values) are one contiguous row of a block, read once and prefetched."""
    block_size, head_size = k_cache.shape[1], k_cache.shape[3]
    width = k_cache.shape[2] * head_size
    keys = k_cache.reshape(k_cache.shape[0] * block_size, width)
    values = v_cache.reshape(v_cache.shape[0] * block_size, width)
    rows = _rows(table, block_size, start, stop)
    scores = _scores(q, scale, keys, values, rows, first_kv_head, group, decode_table)
    heads = q.shape[0]
    peaks, sums = np.empty(heads, dtype=np.float32), np.empty(heads, dtype=np.float32)
    for h in range(heads):
        peaks[h], sums[h] = _softmax_weights(scores[h], rows.shape[0])
    return _tile_values(scores, values, rows, first_kv_head, group, head_size, decode_table), peaks, sums


@njit(**_OPTIONS)
def _rows(table, block_size, start, stop):
    """The row of each position in ``[start, stop)`` in a cache viewed as ``[num_blocks * block_size,
    ...]``, walking the block table block by block (no division per position)."""
    rows = np.empty(stop - start, dtype=np.int64)
    for b in range(start // block_size, (stop + block_size - 1) // block_size):
        first = b * block_size
        for offset in range(max(start - first, 0), min(block_size, stop - first)):
            rows[first + offset - start] = table[b] * block_size + offset
    return rows


def _scores(q, scale, keys, values, rows, first_kv_head, per_kv_head, decode_table):
    """Scores ``[query rows, at least len(rows)]`` of ``q`` (float32) against the keys at ``rows``, times
    ``scale``; query row ``r`` reads KV head ``first_kv_head + r // per_kv_head``. Values are prefetched
    as their keys are read. Bfloat16 queries on a bfloat16 cache go to :mod:`hetero_kernels.cpu_scores`
    where the CPU has AVX-512 BF16 (their scores padded to a whole block of 16 positions), the rest to
    :func:`_tile_scores` (compiled only, see the overload)."""
    raise NotImplementedError


@overload(_scores)
def _scores_overload(q, scale, keys, values, rows, first_kv_head, per_kv_head, decode_table):
    if not (cpu_scores.SUPPORTED and simd.is_bfloat16(keys, decode_table)):
        return lambda q, scale, keys, values, rows, first_kv_head, per_kv_head, decode_table: _float32_scores(
            q, scale, keys, values, rows, first_kv_head, per_kv_head, decode_table
        )

    def by_dot_products(q, scale, keys, values, rows, first_kv_head, per_kv_head, decode_table):
        pairs = cpu_scores.bfloat16_pairs(q)
        if pairs.shape[0] < q.shape[0]:  # not bfloat16 numbers
            return _float32_scores(q, scale, keys, values, rows, first_kv_head, per_kv_head, decode_table)
        return _dot_scores(pairs, scale, keys, values, rows, first_kv_head, per_kv_head)

    return by_dot_products


@njit(**_OPTIONS)
def _float32_scores(q, scale, keys, values, rows, first_kv_head, per_kv_head, decode_table):
    """:func:`_scores` in float32: ``q`` scaled and in the keys' pair order, then :func:`_tile_scores`."""
    return _tile_scores(
        _in_pair_order(q, scale, keys, decode_table), keys, values, rows, first_kv_head, per_kv_head, decode_table
    )


@njit(**_OPTIONS)
def _dot_scores(pairs, scale, keys, values, rows, first_kv_head, per_kv_head):
    """:func:`_scores` of queries as bfloat16 pairs (:func:`cpu_scores.bfloat16_pairs`), sixteen
    positions at a time, every KV head of them while their keys are in the CPU's cache; keys are
    prefetched sixteen positions ahead."""
    count, heads = rows.shape[0], pairs.shape[0]
    kv_heads, head_size = heads // per_kv_head, 2 * pairs.shape[1]
    first, size = first_kv_head * head_size, kv_heads * head_size
    for p in range(min(PREFETCH_AHEAD, count)):
        _prefetch_position(keys, rows[p], first, size)
    positions = cpu_scores.POSITIONS
    scores = np.empty((heads, (count + positions - 1) // positions * positions), dtype=np.float32)
    for p in range(0, count, positions):
        for kv_head in range(kv_heads):
            # a share of the prefetches before each call: all at once, they would queue behind each other
            low, high = p + kv_head * positions // kv_heads, p + (kv_head + 1) * positions // kv_heads
            for i in range(low + PREFETCH_AHEAD, min(high + PREFETCH_AHEAD, count)):
                _prefetch_position(keys, rows[i], first, size)
            for i in range(low, min(high, count)):
                _prefetch_position(values, rows[i], first, size)
            cpu_scores.block(
                scores, pairs, keys, rows, p, first_kv_head + kv_head, kv_head * per_kv_head, per_kv_head, scale
            )
    return scores


@njit(**_OPTIONS)
def _in_pair_order(q, scale, keys, decode_table):
    """``q * scale`` with each 32 dimensions in the order :func:`simd.load_pair` reads the keys' (the
    dimensions past the last whole 32 as they are)."""
    ordered = np.empty_like(q)
    interleaved = simd.interleaves(keys[0], decode_table)
    paired = q.shape[1] - q.shape[1] % simd.PAIR
    for h in range(q.shape[0]):
        for c in range(0, paired, simd.PAIR):
            for i in range(simd.LANES):
                ordered[h, c + i] = (q[h, c + 2 * i] if interleaved else q[h, c + i]) * scale
                ordered[h, c + simd.LANES + i] = (
                    q[h, c + 2 * i + 1] if interleaved else q[h, c + simd.LANES + i]
                ) * scale
        for d in range(paired, q.shape[1]):
            ordered[h, d] = q[h, d] * scale
    return ordered


@njit(**_OPTIONS)
def _softmax_weights(row, seen):
    """``row``'s first ``seen`` scores replaced by their weights ``exp(score - largest)`` (the rest, a
    causal mask, by 0); returns the largest score and the sum of the weights."""
    peak = np.float32(-np.inf)
    for p in range(seen):
        peak = _larger(peak, row[p])
    total = np.float32(0.0)
    for p in range(seen):
        weight = _weight(row[p] - peak)
        row[p] = weight
        total += weight
    for p in range(seen, row.shape[0]):
        row[p] = 0.0
    return peak, total


@njit(**_OPTIONS)
def _parts_per_token(num_tokens, kv_heads):
    """A token is one work item, all its KV heads at once (each cache row read whole, in order), unless
    there are too few tokens to keep the threads busy: then one item per KV head."""
    return kv_heads if num_tokens < SPLIT_BELOW_TOKENS else 1


@njit(**_OPTIONS)
def interleaved(index, count):
    """The sequence that work item ``index`` of ``count`` serves: 0, count - 1, 1, count - 2, ...

    Decodes arrive sorted by length and ``prange`` hands each thread one
    contiguous run of items; interleaved, each run holds short and long
    sequences alike, so the threads finish together."""
    return index // 2 if index % 2 == 0 else count - 1 - index // 2


@njit(parallel=True, **_OPTIONS)
def _decode(out, query, k_cache, v_cache, block_tables, context_lens, scale, decode_table):
    parts = _parts_per_token(query.shape[0], k_cache.shape[2])
    per_part = k_cache.shape[2] // parts
    for item in prange(query.shape[0] * parts):
        b, part = interleaved(item // parts, query.shape[0]), item % parts
        _attend(
            out,
            query,
            b,
            k_cache,
            v_cache,
            block_tables[b],
            context_lens[b],
            part * per_part,
            per_part,
            scale,
            decode_table,
        )


@njit(**_OPTIONS)
def _tiles(query_start_loc, kv_heads, tile):
    """The prefill's work items ``(sequence, first token, tokens, KV head)``: runs of up to ``tile``
    tokens of one chunk, each KV head on its own."""
    count = 0
    for b in range(query_start_loc.shape[0] - 1):
        count += (query_start_loc[b + 1] - query_start_loc[b] + tile - 1) // tile
    items = np.empty((count * kv_heads, 4), dtype=np.int64)
    i = 0
    for b in range(query_start_loc.shape[0] - 1):
        for first in range(query_start_loc[b], query_start_loc[b + 1], tile):
            for kv_head in range(kv_heads):
                items[i] = (b, first, min(tile, query_start_loc[b + 1] - first), kv_head)
                i += 1
    return items


@njit(parallel=True, **_OPTIONS)
def _prefill_tiles(
    out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, decode_table, tile
):
    """A few query tokens per work item, with one KV head: every query head that reads it, for each of
    the tokens, shares each key and value read from memory."""
    kv_heads, head_size = k_cache.shape[2], k_cache.shape[3]
    group = query.shape[1] // kv_heads
    block_size = k_cache.shape[1]
    keys = k_cache.reshape(k_cache.shape[0] * block_size, kv_heads * head_size)
    values = v_cache.reshape(v_cache.shape[0] * block_size, kv_heads * head_size)
    items = _tiles(query_start_loc, kv_heads, tile)
    for index in prange(items.shape[0]):
        b, first, tokens, kv_head = items[interleaved(index, items.shape[0])]
        offset = (
            context_lens[b] - (query_start_loc[b + 1] - query_start_loc[b]) - query_start_loc[b]
        )  # token t sits at t + offset
        visible = first + tokens + offset  # the positions the item's last token sees
        rows = _rows(block_tables[b], block_size, 0, visible)
        q = np.empty((tokens * group, head_size), dtype=np.float32)
        for j in range(tokens):
            for g in range(group):
                for d in range(head_size):
                    q[j * group + g, d] = query[first + j, kv_head * group + g, d]
        scores = _scores(q, scale, keys, values, rows, kv_head, q.shape[0], decode_table)
        sums = np.empty(q.shape[0], dtype=np.float32)
        for r in range(q.shape[0]):
            sums[r] = _softmax_weights(scores[r], first + r // group + offset + 1)[1]
        attended = _tile_values(scores, values, rows, kv_head, q.shape[0], head_size, decode_table)
        for r in range(q.shape[0]):
            inverse = np.float32(1.0) / sums[r]
            target = out[first + r // group, kv_head * group + r % group]
            for d in range(head_size):
                target[d] = attended[r, d] * inverse


@njit(**_OPTIONS)
def _tile_scores(q, keys, values, rows, first_kv_head, per_kv_head, decode_table):
    """Scores ``[query rows, positions]`` of ``q`` (scaled, in pair order) against the keys at ``rows``;
    query row ``r`` reads KV head ``first_kv_head + r // per_kv_head``. Four positions at a time, each
    KV head's 64 dimensions of them read into registers once for every query row of that head (then
    the last whole 32 dimensions, if any, the same way, then the rest one by one). Keys are prefetched
    ``PREFETCH_AHEAD`` positions ahead, values as their keys are read."""
    count, heads, head_size = rows.shape[0], q.shape[0], q.shape[1]
    kv_heads = heads // per_kv_head
    paired = head_size - head_size % simd.PAIR
    slabs = paired - paired % (2 * simd.PAIR)
    first, size = first_kv_head * head_size, kv_heads * head_size
    for p in range(min(PREFETCH_AHEAD, count)):
        _prefetch_position(keys, rows[p], first, size)
    scores = np.zeros((heads, count), dtype=np.float32)
    fours = count - count % 4
    sums = np.empty(4, dtype=np.float32)
    for p in range(0, fours, 4):
        for i in range(p + PREFETCH_AHEAD, min(p + PREFETCH_AHEAD + 4, count)):
            _prefetch_position(keys, rows[i], first, size)
        for i in range(p, p + 4):
            _prefetch_position(values, rows[i], first, size)
        k0, k1, k2, k3 = keys[rows[p]], keys[rows[p + 1]], keys[rows[p + 2]], keys[rows[p + 3]]
        for kv_head in range(kv_heads):
            for slab in range(0, slabs, 2 * simd.PAIR):
                at = (first_kv_head + kv_head) * head_size + slab
                following = at + simd.PAIR
                (a0, b0), (c0, d0) = simd.load_pair(k0, at, decode_table), simd.load_pair(k0, following, decode_table)
                (a1, b1), (c1, d1) = simd.load_pair(k1, at, decode_table), simd.load_pair(k1, following, decode_table)
                (a2, b2), (c2, d2) = simd.load_pair(k2, at, decode_table), simd.load_pair(k2, following, decode_table)
                (a3, b3), (c3, d3) = simd.load_pair(k3, at, decode_table), simd.load_pair(k3, following, decode_table)
                for r in range(kv_head * per_kv_head, (kv_head + 1) * per_kv_head):
                    (qa, qb), (qc, qd) = simd.load_pair(q[r], slab), simd.load_pair(q[r], slab + simd.PAIR)
                    s0 = simd.fma(qd, d0, simd.fma(qc, c0, simd.fma(qb, b0, simd.fma(qa, a0, simd.zeros()))))
                    s1 = simd.fma(qd, d1, simd.fma(qc, c1, simd.fma(qb, b1, simd.fma(qa, a1, simd.zeros()))))
                    s2 = simd.fma(qd, d2, simd.fma(qc, c2, simd.fma(qb, b2, simd.fma(qa, a2, simd.zeros()))))
                    s3 = simd.fma(qd, d3, simd.fma(qc, c3, simd.fma(qb, b3, simd.fma(qa, a3, simd.zeros()))))
                    if slab == 0:  # the first 64 dimensions: the sums are the scores so far
                        simd.store_totals(scores[r], p, s0, s1, s2, s3)
                    else:
                        simd.store_totals(sums, 0, s0, s1, s2, s3)
                        row = scores[r]
                        for i in range(4):
                            row[p + i] += sums[i]
    for p in range(fours, count):
        _prefetch_position(values, rows[p], first, size)
        key = keys[rows[p]]
        for r in range(heads):
            base = (first_kv_head + r // per_kv_head) * head_size
            for slab in range(0, slabs, 2 * simd.PAIR):
                (a, b), (c, d) = (
                    simd.load_pair(key, base + slab, decode_table),
                    simd.load_pair(key, base + slab + simd.PAIR, decode_table),
                )
                (qa, qb), (qc, qd) = simd.load_pair(q[r], slab), simd.load_pair(q[r], slab + simd.PAIR)
                scores[r, p] += simd.total(
                    simd.fma(qd, d, simd.fma(qc, c, simd.fma(qb, b, simd.fma(qa, a, simd.zeros()))))
                )
    for p in range(count if slabs < head_size else 0):  # head sizes not a multiple of 64
        key = keys[rows[p]]
        for r in range(heads):
            base = (first_kv_head + r // per_kv_head) * head_size
            if slabs < paired:
                a, b = simd.load_pair(key, base + slabs, decode_table)
                qa, qb = simd.load_pair(q[r], slabs)
                scores[r, p] += simd.total(simd.fma(qb, b, simd.fma(qa, a, simd.zeros())))
            for d in range(paired, head_size):
                scores[r, p] += q[r, d] * load(key, base + d, decode_table)
    return scores


@njit(**_OPTIONS)
def _tile_values(weights, values, rows, first_kv_head, per_kv_head, head_size, decode_table):
    """``[query rows, head_size]``: each row's ``weights`` times the values at ``rows``, row ``r`` from
    KV head ``first_kv_head + r // per_kv_head``. Two query rows of one KV head and 64 dimensions stay
    in registers while the positions go by; then the last whole 32 dimensions, if any, the same way,
    then the rest one by one."""
    count, heads = rows.shape[0], weights.shape[0]
    paired = head_size - head_size % simd.PAIR
    acc = np.empty((heads, head_size), dtype=np.float32)
    for kv_head in range(heads // per_kv_head):
        last = (kv_head + 1) * per_kv_head - 1
        for slab in range(0, paired, 2 * simd.PAIR):
            at, whole = (
                (first_kv_head + kv_head) * head_size + slab,
                slab + 2 * simd.PAIR <= paired,
            )  # else one pair is left
            for r in range(kv_head * per_kv_head, last + 1, 2):
                w0, w1 = weights[r], weights[min(r + 1, last)]
                a0, a1, a2, a3 = simd.zeros(), simd.zeros(), simd.zeros(), simd.zeros()
                b0, b1, b2, b3 = simd.zeros(), simd.zeros(), simd.zeros(), simd.zeros()
                for p in range(count):
                    row, f, g = values[rows[p]], simd.splat(w0[p]), simd.splat(w1[p])
                    x, y = simd.load_pair(row, at, decode_table)
                    a0, a1, b0, b1 = simd.fma(f, x, a0), simd.fma(f, y, a1), simd.fma(g, x, b0), simd.fma(g, y, b1)
                    if whole:
                        z, u = simd.load_pair(row, at + simd.PAIR, decode_table)
                        a2, a3, b2, b3 = simd.fma(f, z, a2), simd.fma(f, u, a3), simd.fma(g, z, b2), simd.fma(g, u, b3)
                simd.store_pair(acc[r], slab, a0, a1, values[0], decode_table)
                if whole:
                    simd.store_pair(acc[r], slab + simd.PAIR, a2, a3, values[0], decode_table)
                if r < last:
                    simd.store_pair(acc[r + 1], slab, b0, b1, values[0], decode_table)
                    if whole:
                        simd.store_pair(acc[r + 1], slab + simd.PAIR, b2, b3, values[0], decode_table)
    for r in range(heads):
        base = (first_kv_head + r // per_kv_head) * head_size
        for d in range(paired, head_size):
            total = np.float32(0.0)
            for p in range(count):
                total += weights[r, p] * load(values[rows[p]], base + d, decode_table)
            acc[r, d] = total
    return acc


@njit(parallel=True, cache=True)
def _copy_rows(key, value, k_cache, v_cache, slot_mapping):
    block_size = k_cache.shape[1]
    for token in prange(key.shape[0]):
        slot = slot_mapping[token]
        if slot >= 0:
            k_cache[slot // block_size, slot % block_size] = key[token]
            v_cache[slot // block_size, slot % block_size] = value[token]


def _cache_view(cache: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cache as the kernels read it, with how to widen its elements."""
    if cache.dtype == np.float16:
        return cache.view(np.uint16), FLOAT16_BITS_TO_FLOAT32
    if cache.dtype == np.uint16:
        return cache, WIDEN_BFLOAT16
    return cache, NO_DECODE_TABLE


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Store ``key``/``value`` [T, kv_heads, head_size] at their slots (a negative slot is skipped);
    a bfloat16 cache (``uint16`` bits) takes them as bits too."""
    if k_cache.dtype == np.float16:
        key, value = (
            key.astype(np.float16, copy=False).view(np.uint16),
            value.astype(np.float16, copy=False).view(np.uint16),
        )
        k_cache, v_cache = k_cache.view(np.uint16), v_cache.view(np.uint16)
    _copy_rows(key, value, k_cache, v_cache, slot_mapping)


def paged_decode_attention(out, query, k_cache, v_cache, block_tables, context_lens, scale: float) -> None:
    """One query token per sequence [B, heads, head_size] over its ``context_lens[b]`` cached tokens."""
    (k, decode_table), (v, _) = _cache_view(k_cache), _cache_view(v_cache)
    _decode(out, query, k, v, block_tables, context_lens, np.float32(scale), decode_table)


def paged_prefill_attention(
    out, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale: float
) -> None:
    """Chunks of query tokens [T, heads, head_size]; token i of sequence b sits at position
    ``context_lens[b] - q_len_b + i`` and attends causally to every position up to its own."""
    (k, decode_table), (v, _) = _cache_view(k_cache), _cache_view(v_cache)
    _prefill_tiles(
        out, query, k, v, block_tables, query_start_loc, context_lens, np.float32(scale), decode_table, TILE_TOKENS
    )
