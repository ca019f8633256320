""":mod:`hetero_kernels.cpu_packed`'s matmul with AVX-512 VNNI: sixteen output rows per integer dot product.

Each 64-byte weight vector holds four inputs of sixteen output rows
(:mod:`hetero_kernels.cpu_packed`), so ``vpdpbusd`` with the four matching
activation bytes broadcast to every lane adds four products to each row's
32-bit sum. A group (32 inputs, or 16 for the fine 8-bit groups) takes
eight such products per activation byte (the 16-bit activation's high and
low bytes), then one conversion and two multiply-adds apply its sixteen
scales and minimums. A group's weights are loaded (a 4-bit or 6-bit
group's bits joined back into bytes) once for up to :data:`ROWS_AT_ONCE`
activation rows, so a step of several rows reads and unpacks its weights
once. Each block asks the caches for its weights and factors
:data:`PREFETCH_BYTES` ahead of its loads: with the hardware's prefetching
alone, a one-row step over weights that do not fit the caches read them at
about 60% of the bandwidth it reaches so.

The arithmetic is :func:`hetero_kernels.cpu_packed.matmul`'s: the integer
sums are exact, and only the order of the float32 additions differs.
:data:`SUPPORTED` says whether this machine can run it (AVX-512 BW and VNNI,
with Numba compiling for the host CPU).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from hetero_kernels import host
from hetero_kernels.cpu_packed import (
    BIASES,
    LANE,
    ROWS,
    VECTOR,
    factor_vectors,
    form_of,
    forms_of,
    group_of,
    group_vectors,
    prefetch_group,
    quantize_rows,
)
from hetero_kernels.elements import put

SUPPORTED = host.has("avx512bw", "avx512vnni")
ROWS_AT_ONCE = 4  # activation rows sharing a group's loaded weights (the registers hold their sums)
PREFETCH_BYTES = 4096  # how far ahead of its loads a block asks for its weights
CHAINS = 4  # independent chains of vpdpbusd per step of rows: sums of fewer rows are split to keep this many
_OPTIONS = dict(fastmath=True, cache=True)

_I32, _I64 = ir.IntType(32), ir.IntType(64)
_LANES = ir.VectorType(_I32, 16)
_FLOATS = host.FLOATS


def _make_block(count: int, vectors: int):
    """An intrinsic that multiplies one block of sixteen output rows, its groups of ``vectors`` stored
    vectors (4-bit groups: 4, their nibbles eight; 6-bit: 6, or 3 for groups of 16; 8-bit: 8, or 4), by
    ``count`` activation rows from ``first``, into ``sums`` ``[count, 16]`` float32."""

    def codegen(context, builder, signature, args):
        weights, factors, high, low, token_factors, sums = (
            context.make_array(t)(context, builder, a) for t, a in zip(signature.args[:6], args[:6], strict=True)
        )
        first = args[6]
        groups = cgutils.unpack_tuple(builder, weights.shape)[0]
        size = cgutils.unpack_tuple(builder, high.shape)[1]
        token_groups = cgutils.unpack_tuple(builder, token_factors.shape)[1]
        unsigned = signature.args[0].dtype == types.uint8
        bits = form_of(unsigned, vectors)[0]
        dot = host.declare(builder.module, "llvm.x86.avx512.vpdpbusd.512", _LANES, [_LANES] * 3)

        def constant(value):
            return ir.Constant(_I64, value)

        entry = builder.block
        loop = builder.function.append_basic_block("groups")
        done = builder.function.append_basic_block("summed")
        builder.cbranch(builder.icmp_signed(">", groups, constant(0)), loop, done)
        builder.position_at_end(loop)
        g = builder.phi(_I64)
        totals = [builder.phi(_FLOATS) for _ in range(count)]

        parts = [builder.bitcast(v, _LANES) for v in group_vectors(builder, weights, g, vectors, unsigned)]
        group = LANE * len(parts)
        ahead = builder.add(g, constant(max(1, PREFETCH_BYTES // (vectors * VECTOR))))
        prefetch_group(builder, weights, factors, signature.args[1].dtype, ahead, vectors, group)
        scale, minimum = factor_vectors(builder, factors, signature.args[1].dtype, g, group, BIASES[bits])
        start = builder.mul(g, constant(group))
        grown = []
        for r in range(count):
            t = builder.add(first, constant(r))
            row_start = builder.add(builder.mul(t, size), start)

            def broadcast(array, offset, row_start=row_start):
                index = builder.add(row_start, constant(offset))
                return host.splat(builder, builder.load(host.address(builder, array, index, _I32), align=1), _LANES)

            # a few rows leave vpdpbusd's latency exposed: their sums run in more chains, added at the end
            chains = max(1, CHAINS // count)
            uppers, lowers = [ir.Constant(_LANES, None)] * chains, [ir.Constant(_LANES, None)] * chains
            for k, vector in enumerate(parts):
                c = k % chains
                uppers[c] = builder.call(dot, [uppers[c], vector, broadcast(high, LANE * k)])
                lowers[c] = builder.call(dot, [lowers[c], vector, broadcast(low, LANE * k)])
            upper, lower = uppers[0], lowers[0]
            for c in range(1, chains):
                upper, lower = builder.add(upper, uppers[c]), builder.add(lower, lowers[c])
            summed = builder.sitofp(builder.add(builder.shl(upper, ir.Constant(_LANES, [8] * 16)), lower), _FLOATS)
            index = builder.mul(builder.add(builder.mul(t, token_groups), g), constant(2))
            step = builder.load(host.address(builder, token_factors, index, ir.FloatType()))
            beside = builder.add(index, constant(1))
            shifted = builder.load(host.address(builder, token_factors, beside, ir.FloatType()))
            weighted = builder.fmul(scale, host.splat(builder, step, _FLOATS), flags=["fast"])
            total = builder.fadd(totals[r], builder.fmul(summed, weighted, flags=["fast"]), flags=["fast"])
            offsets = builder.fmul(minimum, host.splat(builder, shifted, _FLOATS), flags=["fast"])
            grown.append(builder.fadd(total, offsets, flags=["fast"]))

        following = builder.add(g, constant(1))
        end = builder.block
        g.add_incoming(constant(0), entry)
        g.add_incoming(following, end)
        for total, value in zip(totals, grown, strict=True):
            total.add_incoming(ir.Constant(_FLOATS, None), entry)
            total.add_incoming(value, end)
        builder.cbranch(builder.icmp_signed("<", following, groups), loop, done)
        builder.position_at_end(done)
        results = [builder.phi(_FLOATS) for _ in range(count)]
        for r, result in enumerate(results):
            result.add_incoming(ir.Constant(_FLOATS, None), entry)
            result.add_incoming(grown[r], end)
            builder.store(result, host.address(builder, sums, constant(16 * r), _FLOATS), align=1)
        return context.get_dummy_value()

    def block(typingctx, weights, factors, high, low, token_factors, sums, first):
        return types.void(weights, factors, high, low, token_factors, sums, first), codegen

    return intrinsic(block)


def _count_dispatch(stored: int):
    """A jitted function calling the block intrinsic for ``count`` (1, 2 or 4) rows of ``stored`` vectors a group."""
    one, two, four = (_make_block(count, stored) for count in (1, 2, 4))

    @njit(inline="always")
    def rows(block, count, factors, high, low, token_factors, sums, t):
        if count == 4:
            four(block, factors, high, low, token_factors, sums, t)
        elif count == 2:
            two(block, factors, high, low, token_factors, sums, t)
        else:
            one(block, factors, high, low, token_factors, sums, t)

    return rows


_BY_COUNT = {stored: _count_dispatch(stored) for stored in (3, 4, 6, 8)}


def _rows(block, count, factors, high, low, token_factors, sums, t):
    """Activation rows ``t .. t + count - 1`` (``count`` 1, 2 or 4) times one block into ``sums`` (compiled
    only, see the overload)."""
    raise NotImplementedError


@overload(_rows, inline="always")
def _rows_overload(block, count, factors, high, low, token_factors, sums, t):
    first, second, third = forms_of(block)
    one, two, three = _BY_COUNT[first], _BY_COUNT[second], _BY_COUNT[third]

    def rows(block, count, factors, high, low, token_factors, sums, t):
        stored = block.shape[1]
        if stored == first:
            one(block, count, factors, high, low, token_factors, sums, t)
        elif stored == second:
            two(block, count, factors, high, low, token_factors, sums, t)
        else:
            three(block, count, factors, high, low, token_factors, sums, t)

    return rows


@njit(parallel=True, **_OPTIONS)
def matmul(x, weights, factors, out):
    """``out`` ``[T, out]`` = ``x`` ``[T, in]`` times the transposed weights packed by
    :func:`~hetero_kernels.cpu_packed.pack4` or :func:`~hetero_kernels.cpu_packed.pack8`, rounded to
    ``out``'s dtype. Blocks of sixteen output rows are shared out among the threads; each reads its
    weights once per :data:`ROWS_AT_ONCE` activation rows."""
    high, low, token_factors = quantize_rows(x, group_of(weights))
    tokens, columns = x.shape[0], out.shape[1]
    blocks = weights.shape[0]
    sums = np.empty((blocks, ROWS_AT_ONCE, ROWS), np.float32)
    for b in prange(blocks):
        block, block_factors, block_sums = weights[b], factors[b], sums[b]
        width = min(ROWS, columns - b * ROWS)
        t = 0
        while t < tokens:
            left = tokens - t
            count = ROWS_AT_ONCE if left >= ROWS_AT_ONCE else (2 if left >= 2 else 1)
            _rows(block, count, block_factors, high, low, token_factors, block_sums, t)
            for r in range(count):
                for c in range(width):
                    put(out[t + r], b * ROWS + c, block_sums[r, c])
            t += count
