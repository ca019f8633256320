"""A Llama-family decode step's work between its matmuls, fused into few Numba CPU calls.

At batch 1 a decoder layer's norms, RoPE, cache writes and attention are
two dozen torch ops on a few hundred numbers each, and their dispatch costs
more than their arithmetic. Here the norms (with the residual add before
them) and the attention sublayer between the q/k/v and output projections
are one call each:

- :func:`rms_norm`: the float32 residual stream (plus a sublayer's
  output, added in place) through RMSNorm, into the compute dtype;
- :func:`rotary_decode_attention`: from the fused q/k/v projection of one
  token per sequence, rotate-half RoPE on q and k, k and v written to their
  cache slots, then paged attention over each sequence's context;
- :func:`rotary_write`: the same RoPE and cache writes for any tokens
  (prefill chunks), leaving attention to the caller;
- :func:`swiglu`: the MLP's ``silu(gate) * up`` from the fused gate/up
  projection in one pass (torch's ops are a split, two kernels and a
  temporary).

Long steps (a prefill chunk) gain too: torch's RMSNorm and RoPE make
several passes over the activations, these one.

Activations are float32 or bfloat16 (passed as raw bits, ``uint16``, see
:mod:`hetero_kernels.dtypes`); in bfloat16 every elementwise op rounds to
bfloat16 where torch's ops would (RoPE's products and their sum), so the
results match torch's op by op. The reductions (RMSNorm's
mean of squares, attention) accumulate in float32, reassociated. The cache
is in the activations' dtype, except that :func:`rotary_decode_attention`
also takes float32 activations with a bfloat16 cache (keys and values
rounded as they are written).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from hetero_kernels.cpu import SPLIT_BELOW_TOKENS, attend_span, exp, interleaved
from hetero_kernels.dtypes import NO_DECODE_TABLE, WIDEN_BFLOAT16
from hetero_kernels.elements import get, put, rounded

_OPTIONS = dict(fastmath=True, cache=True)
PARALLEL_FROM_ROWS = 32  # fewer rows of a norm cost less than waking the other threads
SILU_ZERO_BELOW = np.float32(
    -88.0
)  # below, silu(x) = x / (1 + exp(-x)) is under 1e-36 (torch gives 0 from -88.7: exp overflows)


@njit(fastmath={"reassoc", "nsz"}, cache=True)
def _sum_of_squares(row):
    """In float64: the mean square comes out correctly rounded to float32 (torch's float32 sum is
    within an ulp or two of it), whatever order the vectorised loop adds in."""
    total = 0.0
    for i in range(row.shape[0]):
        total += np.float64(row[i]) * np.float64(row[i])
    return total


@njit(cache=True)
def _normalize_row(hidden, delta, weight, eps, out, t):
    """Strict float32 arithmetic (no fastmath) past the sum, in torch's order: ``(x * rsqrt(mean + eps)) * w``."""
    row = hidden[t]
    if delta is not None:
        for i in range(row.shape[0]):
            row[i] += get(delta[t], i)
    inverse = np.float32(1.0) / np.sqrt(np.float32(_sum_of_squares(row) / row.shape[0]) + eps)
    for i in range(row.shape[0]):
        put(out[t], i, (row[i] * inverse) * weight[i])


@njit(**_OPTIONS)
def _normalize(hidden, delta, weight, eps, out):
    for t in range(hidden.shape[0]):
        _normalize_row(hidden, delta, weight, eps, out, t)


@njit(parallel=True, **_OPTIONS)
def _normalize_in_parallel(hidden, delta, weight, eps, out):
    for t in prange(hidden.shape[0]):
        _normalize_row(hidden, delta, weight, eps, out, t)


@njit(cache=True)
def normalize_rows(hidden, delta, weight, eps, out):
    """:func:`rms_norm` with ``eps`` a float32: on both threads from ``PARALLEL_FROM_ROWS`` rows."""
    if hidden.shape[0] >= PARALLEL_FROM_ROWS:
        _normalize_in_parallel(hidden, delta, weight, eps, out)
    else:
        _normalize(hidden, delta, weight, eps, out)


def rms_norm(hidden, weight, eps: float, out, delta=None) -> None:
    """``hidden += delta`` (``delta`` in the activations' dtype; skipped when None), then ``out`` =
    RMSNorm of ``hidden`` (float32 ``[T, H]``) with ``weight`` (float32 ``[H]``)."""
    normalize_rows(hidden, delta, weight, np.float32(eps), out)


@njit(inline="always", **_OPTIONS)
def _rotate(dest, row, start, cos, sin, like):
    """``dest`` = the head at ``row[start:]`` after rotate-half RoPE, rounded as torch's
    ``x * cos + cat(-x2, x1) * sin`` rounds in the dtype of ``like``. Every array is sliced so the
    loop indexes from 0: LLVM then knows no index wraps around and vectorises the loop."""
    half = dest.shape[0] // 2
    x1, x2 = row[start : start + half], row[start + half : start + 2 * half]
    cos1, cos2, sin1, sin2 = cos[:half], cos[half:], sin[:half], sin[half:]
    dest1, dest2 = dest[:half], dest[half:]
    for d in range(half):
        first, second = get(x1, d), get(x2, d)
        put(dest1, d, rounded(rounded(first * get(cos1, d), like) + rounded(-second * get(sin1, d), like), like))
        put(dest2, d, rounded(rounded(second * get(cos2, d), like) + rounded(first * get(sin2, d), like), like))


@njit(inline="always", **_OPTIONS)
def _write_kv(key, row, values, k_cache, v_cache, slot, kv_head):
    """``key`` (rotated, in the cache's dtype) and the value at ``row[values:]`` (rounded to the cache's
    dtype) into ``slot`` of the caches (skipped when negative)."""
    if slot < 0:
        return
    block, offset = slot // k_cache.shape[1], slot % k_cache.shape[1]
    k_cache[block, offset, kv_head] = key
    value, source = v_cache[block, offset, kv_head], row[values : values + key.shape[0]]
    for d in range(source.shape[0]):  # indexed from 0, so the loop vectorises
        put(value, d, get(source, d))


@njit(inline="always", **_OPTIONS)
def _write_keys(row, cos, sin, k_cache, v_cache, slot, num_heads, first_kv_head, count, like):
    """KV heads ``first_kv_head .. + count`` of one token's fused q/k/v ``row``: the keys rotated, then
    written with their values at ``slot``."""
    num_kv_heads, head_size = k_cache.shape[2], k_cache.shape[3]
    key = np.empty(head_size, dtype=k_cache.dtype)
    for kv_head in range(first_kv_head, first_kv_head + count):
        _rotate(key, row, (num_heads + kv_head) * head_size, cos, sin, like)
        _write_kv(key, row, (num_heads + num_kv_heads + kv_head) * head_size, k_cache, v_cache, slot, kv_head)


@njit(parallel=True, **_OPTIONS)
def rotary_decode_planned(
    out,
    qkv,
    cos,
    sin,
    k_cache,
    v_cache,
    slots,
    block_tables,
    context_lens,
    num_heads,
    scale,
    decode_table,
    parts,
    spans,
    keys_first,
):
    """:func:`rotary_decode_attention` with its plan (:func:`decode_plan`) given, callable from other
    compiled kernels (:mod:`hetero_kernels.cpu_layer`)."""
    num_kv_heads, head_size = k_cache.shape[2], k_cache.shape[3]
    group, per_part = num_heads // num_kv_heads, num_kv_heads // parts
    items, heads = qkv.shape[0] * parts, per_part * group
    partial = np.empty((items if spans > 1 else 0, spans, heads, head_size), dtype=np.float32)
    peaks, sums = np.empty((items, spans, heads), dtype=np.float32), np.empty((items, spans, heads), dtype=np.float32)
    if keys_first:  # rows that read each other's keys: all are written before any is read
        for b in prange(qkv.shape[0]):
            _write_keys(qkv[b], cos[b], sin[b], k_cache, v_cache, slots[b], num_heads, 0, num_kv_heads, out)
    for work in prange(items * spans):
        item, span = work // spans, work % spans
        b, first_kv_head = interleaved(item // parts, qkv.shape[0]), (item % parts) * per_part
        row, c, s, length = qkv[b], cos[b], sin[b], context_lens[b]
        if not keys_first and span == spans - 1:  # the last span holds the new position: its key goes in first
            _write_keys(row, c, s, k_cache, v_cache, slots[b], num_heads, first_kv_head, per_part, out)
        q = np.empty((heads, head_size), dtype=np.float32)
        for h in range(heads):
            _rotate(q[h], row, (first_kv_head * group + h) * head_size, c, s, out)
        start, stop = length * span // spans, length * (span + 1) // spans
        acc, peaks[item, span], sums[item, span] = attend_span(
            q, scale, group, k_cache, v_cache, block_tables[b], start, stop, first_kv_head, decode_table
        )
        if spans == 1:  # nothing to merge: normalised and written here, in parallel
            for h in range(heads):
                head, total = out[b, first_kv_head * group + h], sums[item, span, h]
                for d in range(head_size):
                    put(head, d, acc[h, d] / total)
        else:
            partial[item, span] = acc
    for item in range(items if spans > 1 else 0):  # merging is little work: serially, without a second parallel region
        b, first_head = interleaved(item // parts, qkv.shape[0]), (item % parts) * heads
        for h in range(heads):
            peak = np.float32(-np.inf)
            for span in range(spans):
                peak = max(peak, peaks[item, span, h])
            total = np.float32(0.0)
            weights = np.empty(spans, dtype=np.float32)
            for span in range(spans):
                weights[span] = np.exp(peaks[item, span, h] - peak)
                total += sums[item, span, h] * weights[span]
            head = out[b, first_head + h]
            for d in range(head_size):
                value = np.float32(0.0)
                for span in range(spans):
                    value += partial[item, span, h, d] * weights[span]
                put(head, d, value / total)


def rotary_decode_attention(
    out,
    qkv,
    cos,
    sin,
    k_cache,
    v_cache,
    slots,
    block_tables,
    context_lens,
    num_heads: int,
    scale: float,
    keys_first: bool = False,
) -> None:
    """One new token per row: ``qkv`` ``[B, (heads + 2 * kv_heads) * head_size]`` (q heads, k heads, v
    heads) with ``cos``/``sin`` ``[B, head_size]`` for its position; writes its rotated key and its
    value at ``slots[b]`` of ``k_cache``/``v_cache`` and the attention over the ``context_lens[b]``
    positions of its sequence (this one included) to ``out`` ``[B, heads, head_size]``. Every array but
    the int tables is in the activations' dtype, or the caches in bfloat16 under float32 activations.

    Rows are one decode per sequence, or, with ``keys_first``, may also be consecutive new tokens of one
    sequence (a verification step's), each with its own length: then every row's key and value is written
    before any row attends.

    A work item is a row with all its heads; below ``SPLIT_BELOW_TOKENS`` rows, one KV head over one of
    two halves of the positions (merged after), so that both threads get as much work."""
    plan = decode_plan(qkv.shape[0], k_cache, keys_first)
    rotary_decode_planned(
        out, qkv, cos, sin, k_cache, v_cache, slots, block_tables, context_lens, num_heads, np.float32(scale), *plan
    )


def decode_plan(rows: int, k_cache, keys_first: bool = False) -> tuple:
    """How :func:`rotary_decode_attention` shares out a step: the cache's widening marker, the parts each
    row's KV heads and the spans its positions are cut into, and whether all keys are written first."""
    decode_table = WIDEN_BFLOAT16 if k_cache.dtype == np.uint16 else NO_DECODE_TABLE
    few = rows < SPLIT_BELOW_TOKENS
    parts, spans = (k_cache.shape[2], 2) if few else (1, 1)
    return decode_table, parts, spans, keys_first


@njit(parallel=True, **_OPTIONS)
def rotary_write(query, key, qkv, cos, sin, k_cache, v_cache, slots):
    """Any tokens (prefill chunks, decodes): ``qkv`` ``[T, (heads + 2 * kv_heads) * head_size]`` with
    ``cos``/``sin`` ``[T, head_size]``; writes the rotated queries to ``query`` ``[T, heads,
    head_size]``, the rotated keys to ``key`` ``[T, kv_heads, head_size]`` and to ``slots[t]`` of
    ``k_cache``, and the values to ``slots[t]`` of ``v_cache`` (a negative slot is skipped). Attention
    is the caller's."""
    num_heads, num_kv_heads, head_size = query.shape[1], key.shape[1], query.shape[2]
    for t in prange(qkv.shape[0]):
        row, c, s = qkv[t], cos[t], sin[t]
        for h in range(num_heads):
            _rotate(query[t, h], row, h * head_size, c, s, query)
        for kv_head in range(num_kv_heads):
            _rotate(key[t, kv_head], row, (num_heads + kv_head) * head_size, c, s, query)
            _write_kv(
                key[t, kv_head],
                row,
                (num_heads + num_kv_heads + kv_head) * head_size,
                k_cache,
                v_cache,
                slots[t],
                kv_head,
            )


@njit(parallel=True, **_OPTIONS)
def swiglu(gate_up, out):
    """``out`` ``[T, I]`` = ``silu(gate) * up`` for ``gate_up`` ``[T, 2 * I]`` (the gate's columns, then
    the up projection's), rounded as torch's ``F.silu(gate) * up`` rounds: the SiLU to the activations'
    dtype, then the product.

    Parallel even for one row: compiled serially, this loop is not vectorised (2.5x slower at one row)."""
    size = out.shape[1]
    for t in prange(out.shape[0]):
        gate, up, dest = gate_up[t, :size], gate_up[t, size:], out[t]
        for i in range(size):
            g = get(gate, i)
            silu = g / (np.float32(1.0) + exp(-g)) if g > SILU_ZERO_BELOW else np.float32(0.0)
            put(dest, i, rounded(silu, dest) * get(up, i))
