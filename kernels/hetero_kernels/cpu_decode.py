"""A Llama-family decode step's work between its matmuls, fused into few Numba CPU calls.

At batch 1 a decoder layer's norms, RoPE, cache writes and attention are
two dozen torch ops on a few hundred numbers each, and their dispatch costs
more than their arithmetic. Here the norms (with the residual add before
them) and the attention sublayer between the q/k/v and output projections
are one call each:

- :func:`rms_norm` and :func:`add_rms_norm`: the float32 residual stream
  (plus a sublayer's output, added in place) through RMSNorm, into the
  compute dtype;
- :func:`rotary_decode_attention`: from the fused q/k/v projection of one
  token per sequence, rotate-half RoPE on q and k, k and v written to their
  cache slots, then paged attention over each sequence's context.

Activations are float32 or bfloat16 (passed as raw bits, ``uint16``, see
:mod:`hetero_kernels.dtypes`); in bfloat16 every elementwise op rounds to
bfloat16 where torch's ops would (RoPE's products and their sum), so the
results match torch's op by op. The reductions (RMSNorm's
mean of squares, attention) accumulate in float32, reassociated. The cache
is in the activations' dtype.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from hetero_kernels.cpu import SPLIT_BELOW_TOKENS, _bfloat16_to_float32, attend_heads
from hetero_kernels.dtypes import NO_DECODE_TABLE, WIDEN_BFLOAT16

_OPTIONS = dict(fastmath=True, cache=True)


@intrinsic
def _float32_to_bfloat16(typingctx, value):
    """The bfloat16 nearest ``value`` (ties to even), as its uint16 bits."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        odd = builder.and_(builder.lshr(bits, ir.Constant(i32, 16)), ir.Constant(i32, 1))
        rounded = builder.add(builder.add(bits, ir.Constant(i32, 0x7FFF)), odd)
        return builder.trunc(builder.lshr(rounded, ir.Constant(i32, 16)), ir.IntType(16))

    return types.uint16(types.float32), codegen


def _get(array, i):
    """``array[i]`` as a float32 (compiled only, see the overload)."""
    raise NotImplementedError


@overload(_get, inline="always")
def _get_overload(array, i):
    if array.dtype == types.uint16:
        return lambda array, i: _bfloat16_to_float32(array[i])
    return lambda array, i: np.float32(array[i])


def _put(array, i, value):
    """``array[i] = value``, rounded to the array's dtype (compiled only, see the overload)."""
    raise NotImplementedError


@overload(_put, inline="always")
def _put_overload(array, i, value):
    if array.dtype == types.uint16:

        def put_bits(array, i, value):
            array[i] = _float32_to_bfloat16(value)

        return put_bits

    def put(array, i, value):
        array[i] = value

    return put


def _rounded(value, like):
    """``value`` rounded to the dtype of the array ``like`` (compiled only, see the overload)."""
    raise NotImplementedError


@overload(_rounded, inline="always")
def _rounded_overload(value, like):
    if like.dtype == types.uint16:
        return lambda value, like: _bfloat16_to_float32(_float32_to_bfloat16(value))
    return lambda value, like: value


@njit(**_OPTIONS)
def _normalize(hidden, weight, eps, out):
    for t in range(hidden.shape[0]):
        row = hidden[t]
        total = np.float32(0.0)
        for i in range(row.shape[0]):
            total += row[i] * row[i]
        inverse = np.float32(1.0) / np.sqrt(total / np.float32(row.shape[0]) + eps)
        for i in range(row.shape[0]):
            _put(out[t], i, row[i] * inverse * weight[i])


@njit(**_OPTIONS)
def rms_norm(hidden, weight, eps, out):
    """``out`` = RMSNorm of ``hidden`` (float32 ``[T, H]``) with ``weight`` (float32 ``[H]``)."""
    _normalize(hidden, weight, np.float32(eps), out)


@njit(**_OPTIONS)
def add_rms_norm(hidden, delta, weight, eps, out):
    """``hidden += delta`` (``delta`` in the activations' dtype), then ``out`` = RMSNorm of ``hidden``."""
    for t in range(hidden.shape[0]):
        for i in range(hidden.shape[1]):
            hidden[t, i] += _get(delta[t], i)
    _normalize(hidden, weight, np.float32(eps), out)


@njit(**_OPTIONS)
def _rotated(row, start, d, half, cos, sin, like):
    """Element ``d`` of the head at ``row[start:]`` after rotate-half RoPE, rounded as torch's
    ``x * cos + cat(-x2, x1) * sin`` rounds in the activations' dtype."""
    x = _get(row, start + d)
    partner = -_get(row, start + d + half) if d < half else _get(row, start + d - half)
    return _rounded(_rounded(x * _get(cos, d), like) + _rounded(partner * _get(sin, d), like), like)


@njit(parallel=True, **_OPTIONS)
def _rotary_decode(out, qkv, cos, sin, k_cache, v_cache, slots, block_tables, context_lens, num_heads, scale, decode_table, parts):
    block_size, num_kv_heads, head_size = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    group, half = num_heads // num_kv_heads, head_size // 2
    per_part = num_kv_heads // parts
    for item in prange(qkv.shape[0] * parts):
        b, first_kv_head = item // parts, (item % parts) * per_part
        row, c, s = qkv[b], cos[b], sin[b]
        block, offset = slots[b] // block_size, slots[b] % block_size
        for kv_head in range(first_kv_head, first_kv_head + per_part):
            keys, values = (num_heads + kv_head) * head_size, (num_heads + num_kv_heads + kv_head) * head_size
            for d in range(head_size):
                _put(k_cache[block, offset, kv_head], d, _rotated(row, keys, d, half, c, s, out))
                v_cache[block, offset, kv_head, d] = row[values + d]
        q = np.empty((per_part * group, head_size), dtype=np.float32)
        for h in range(q.shape[0]):
            start = (first_kv_head * group + h) * head_size
            for d in range(head_size):
                q[h, d] = _rotated(row, start, d, half, c, s, out) * scale
        attended = attend_heads(q, group, k_cache, v_cache, block_tables[b], context_lens[b], first_kv_head, decode_table)
        for h in range(q.shape[0]):
            head = out[b, first_kv_head * group + h]
            for d in range(head_size):
                _put(head, d, attended[h, d])


def rotary_decode_attention(out, qkv, cos, sin, k_cache, v_cache, slots, block_tables, context_lens, num_heads: int, scale: float) -> None:
    """One decode token per sequence: ``qkv`` ``[B, (heads + 2 * kv_heads) * head_size]`` (q heads, k
    heads, v heads) with ``cos``/``sin`` ``[B, head_size]`` for its position; writes its rotated key and
    its value at ``slots[b]`` of ``k_cache``/``v_cache`` and the attention over the sequence's
    ``context_lens[b]`` positions (this one included) to ``out`` ``[B, heads, head_size]``. Every array
    but the int tables is in the activations' dtype."""
    decode_table = WIDEN_BFLOAT16 if k_cache.dtype == np.uint16 else NO_DECODE_TABLE
    parts = k_cache.shape[2] if qkv.shape[0] < SPLIT_BELOW_TOKENS else 1
    _rotary_decode(out, qkv, cos, sin, k_cache, v_cache, slots, block_tables, context_lens, num_heads, np.float32(scale), decode_table, parts)
