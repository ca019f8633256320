"""Group-quantized weights in one packed layout for every row count: packing, the portable matmul, widening.

GGUF's weight types reduce to two exact forms (see the torch executor's
``quantized`` module): 4-bit ``w = scale * q + minimum`` with ``q`` in 0..15
per group of 32 inputs, and 8-bit ``w = scale * q + offset`` with ``q`` in
-128..127 per group of 32 or 16. Both are packed here the same way, sixteen
output rows interleaved, so that a 64-byte vector holds four consecutive
inputs of sixteen rows: one ``vpdpbusd`` (:mod:`hetero_kernels.cpu_packed_vnni`)
multiplies sixteen rows by four inputs of one activation row, and the
weights loaded for a group serve every activation row of the step::

    weights [blocks, groups, vectors, 64]        block b = output rows 16b .. 16b + 15
    vector k of a group, byte 4 * r + i  ->  row 16b + r, input i of the vector's four

    4-bit (uint8, 4 vectors a group of 32):  vector k holds inputs 4k .. 4k+3 in its low
                                             nibbles and 16 + 4k .. 16 + 4k + 3 in its high ones
    8-bit (int8, 8 vectors a group of 32,    vector k holds inputs 4k .. 4k+3, the signed
           or 4 a group of 16):              bytes as the file has them
    6-bit (uint8, 6 vectors a group of 32,   8-bit weights in -32..31, as q + 32: of a group's
           or 3 a group of 16):              n = 8 (or 4) runs of four inputs, vector k < n/2
                                             holds run k in its low nibbles and run k + n/2 in
                                             its high ones; vector n/2 + j the high two bits
                                             of runs j, j + n/4, j + n/2, j + 3n/4 at bits
                                             0, 2, 4, 6

    factors [blocks, groups, 2, 16]           the group's 16 scales, then its 16 minimums:
                                             float16 bits (uint16) where that holds every one
                                             exactly (GGUF's own factors), else float32

    or, for factors given as :class:`Coded` (a K-quant super-block's ``base * code``):
    factors [blocks, supers, 64 + 32 * per]   int8, per 256 inputs (``per`` groups): the sixteen
                                             rows' scale bases then their second bases (float16
                                             bits, 2 bytes each), then for each group its sixteen
                                             scale codes and sixteen second codes (signed bytes)

A coded group's ``scale = base * code`` and its second factor likewise, each
one float32 product, as GGUF's dequantization computes them. The second
factor is the minimum for 4-bit weights and the offset for 8-bit and 6-bit
ones, the minimum then computed from it as below. A 4-bit group's factors
take 40 bytes of 296 in this form (128 of 384 in float32).

The minimums are what the arithmetic adds per unit of ``sum(x)``: ``w = scale
* q + minimum`` for 4-bit weights and, since the kernels read an 8-bit ``q``
as ``q + 128`` (unsigned, as ``vpdpbusd`` takes its first operand), ``w =
scale * (q + 128) + minimum`` with ``minimum = offset - 128 * scale`` for
8-bit ones; 6-bit ones likewise with ``q + 32`` and ``offset - 32 * scale``.
:func:`pack8` stores 8-bit weights in 6 bits wherever they fit (GGUF's
5-bit and 6-bit types, and 4-bit ones joined to them). A last block with
fewer than sixteen rows is padded with zero weights, never written out.

Activations are quantized per group of 32 to 16-bit integers ``x = step *
v``, ``|v| <= 32639`` (:func:`quantize_rows`), over a hundred times finer
than bfloat16; each group's sum is then ``scale * step * sum(q * v) +
minimum * step * sum(v)``, the integer sums exact.

:func:`matmul` is the portable twin: plain Numba over the same layout and
arithmetic, on any CPU, and the oracle the SIMD kernel is tested against.
:func:`unpack` widens rows back to float32 or bfloat16 (a many-row step's
dense matmul, an embedding lookup).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from hetero_kernels import host
from hetero_kernels.dtypes import FLOAT16_BITS_TO_FLOAT32
from hetero_kernels.elements import get, put

ROWS = 16  # output rows interleaved in a vector
LANE = 4  # consecutive inputs of a row in a vector
VECTOR = ROWS * LANE  # bytes
GROUP_SIZE = 32
FINE_GROUP_SIZE = 16  # the 8-bit groups GGUF's Q6_K and Q2_K scale
SUPER_SIZE = 256  # the inputs a coded base spans (a K-quant super-block)
NARROW = 32  # 8-bit weights in -NARROW .. NARROW - 1 are stored in 6 bits, as q + NARROW
BIASES = {4: 0, 6: NARROW, 8: 128}  # what the kernels add to each form's q (bits: bias)


def form_of(unsigned: bool, stored: int) -> tuple[int, int]:
    """``(bits, runs)`` of weights with ``stored`` vectors a group (uint8 where ``unsigned``, else int8):
    their width and the runs of four inputs a group holds."""
    if not unsigned:
        return 8, stored
    return (4, 2 * stored) if stored == 4 else (6, stored * 4 // 3)


LIMIT = np.float32(32639.0)  # the largest |v|: 256 * 127 + 127, so that its high byte stays signed
SMALLEST_STEP = np.float32(1e-30)  # finer steps would overflow their inverse
PARALLEL_QUANTIZE_FROM = 8192  # activation values from which quantize_rows shares its rows among the threads
_OPTIONS = dict(fastmath=True, cache=True)


def blocks_of(rows: int) -> int:
    return -(-rows // ROWS)


def _interleaved(values: np.ndarray, group: int) -> np.ndarray:
    """``values`` ``[out, in]`` as ``[blocks, groups, group // 4, 64]``, zero rows padding the last block."""
    rows, size = values.shape
    blocks = blocks_of(rows)
    padded = np.zeros((blocks * ROWS, size), values.dtype)
    padded[:rows] = values
    grid = padded.reshape(blocks, ROWS, size // group, group // LANE, LANE)
    return np.ascontiguousarray(grid.transpose(0, 2, 3, 1, 4)).reshape(blocks, size // group, group // LANE, VECTOR)


class Coded(NamedTuple):
    """Factors ``base * code`` as K-quant super-blocks hold them: ``base`` ``[out, in // 256]`` float32
    (float16 values), ``codes`` ``[out, groups]`` integers in -128..127."""

    base: np.ndarray
    codes: np.ndarray

    def values(self) -> np.ndarray:
        """The factors as float32 ``[out, groups]``, each one product."""
        per = self.codes.shape[1] // self.base.shape[1]
        return np.repeat(np.asarray(self.base, np.float32), per, axis=1) * self.codes.astype(np.float32)

    def packable(self) -> bool:
        """Whether the layout can hold these exactly: float16 bases, byte codes, whole super-blocks."""
        base = np.asarray(self.base, np.float32)
        with np.errstate(over="ignore"):
            halves = base.astype(np.float16).astype(np.float32)
        return (
            self.codes.shape[1] % max(1, self.base.shape[1]) == 0
            and np.array_equal(halves, base)
            and (self.codes.size == 0 or (self.codes.min() >= -128 and self.codes.max() <= 127))
        )


Factor = np.ndarray | Coded


def _pack_factors(scale: Factor, second: Factor | None, group: int, bias: int) -> np.ndarray:
    """The layout's factors: coded where both are :class:`Coded` and packable, else values (the minimums
    being ``second - bias * scale``)."""
    if isinstance(scale, Coded) and second is None:
        second = Coded(np.zeros_like(scale.base), np.zeros_like(scale.codes))
    if isinstance(scale, Coded) and isinstance(second, Coded) and scale.packable() and second.packable():
        return _coded_factors(scale, second, group)
    scale = scale.values() if isinstance(scale, Coded) else np.asarray(scale, np.float32)
    if second is None:
        second = np.zeros_like(scale)
    second = second.values() if isinstance(second, Coded) else np.asarray(second, np.float32)
    return _factors(scale, np.float32(-bias) * scale + second if bias else second)


def _coded_factors(scale: Coded, second: Coded, group: int) -> np.ndarray:
    """``[blocks, supers, 64 + 32 * per]`` int8, as the module docstring draws it."""
    rows, groups = scale.codes.shape
    per = SUPER_SIZE // group
    if groups % per or scale.base.shape[1] != groups // per or second.base.shape[1] != groups // per:
        raise ValueError(f"coded factors need whole super-blocks of {SUPER_SIZE} inputs ({per} groups of {group})")
    supers, blocks = groups // per, blocks_of(rows)
    bases = np.zeros((blocks * ROWS, supers, 2), np.float16)
    bases[:rows, :, 0], bases[:rows, :, 1] = scale.base, second.base
    bases = np.ascontiguousarray(bases.reshape(blocks, ROWS, supers, 2).transpose(0, 2, 3, 1))
    codes = np.zeros((blocks * ROWS, groups, 2), np.int8)
    codes[:rows, :, 0], codes[:rows, :, 1] = scale.codes, second.codes
    codes = codes.reshape(blocks, ROWS, supers, per, 2).transpose(0, 2, 3, 4, 1).reshape(blocks, supers, per * 2 * ROWS)
    return np.concatenate([bases.view(np.int8).reshape(blocks, supers, 4 * ROWS), codes], axis=2)


def _factors(scale: np.ndarray, minimum: np.ndarray) -> np.ndarray:
    """``[blocks, groups, 2, 16]``: each group's scales then minimums, as float16 bits where exact."""
    rows, groups = scale.shape
    blocks = blocks_of(rows)
    both = np.zeros((blocks * ROWS, groups, 2), np.float32)
    both[:rows, :, 0], both[:rows, :, 1] = scale, minimum
    laid = np.ascontiguousarray(both.reshape(blocks, ROWS, groups, 2).transpose(0, 2, 3, 1))
    with np.errstate(over="ignore"):  # beyond float16's range: inf, which compares unequal
        halves = laid.astype(np.float16)
    return halves.view(np.uint16) if np.array_equal(halves.astype(np.float32), laid) else laid


def _check(size: int, groups: int, sizes: tuple[int, ...]) -> int:
    if size % GROUP_SIZE:
        raise ValueError(f"input size {size} is not a multiple of {GROUP_SIZE}")
    if groups == 0 or size % groups or size // groups not in sizes:
        raise ValueError(f"{groups} factors per row of {size} inputs: groups must be {' or '.join(map(str, sizes))}")
    return size // groups


def _groups(factor: Factor) -> int:
    return (factor.codes if isinstance(factor, Coded) else factor).shape[1]


def pack4(q: np.ndarray, scale: Factor, minimum: Factor) -> tuple[np.ndarray, np.ndarray]:
    """4-bit weights ``scale * q + minimum`` (``q`` ``[out, in]`` 0..15, ``in`` a multiple of 32; ``scale``
    and ``minimum`` ``[out, in // 32]``, or both :class:`Coded`) as ``(weights, factors)`` in the layout
    above."""
    _check(q.shape[1], _groups(scale), (GROUP_SIZE,))
    q = np.asarray(q, np.uint8)
    half = GROUP_SIZE // 2
    grouped = q.reshape(q.shape[0], -1, GROUP_SIZE)
    nibbles = (grouped[..., :half] | (grouped[..., half:] << 4)).reshape(q.shape[0], -1)
    return _interleaved(nibbles, half), _pack_factors(scale, minimum, GROUP_SIZE, BIASES[4])


def pack8(q: np.ndarray, scale: Factor, offset: Factor | None = None) -> tuple[np.ndarray, np.ndarray]:
    """8-bit weights ``scale * q + offset`` (``q`` ``[out, in]`` int8, ``in`` a multiple of 32; ``scale``
    and ``offset`` ``[out, in // 32]`` or ``[out, in // 16]``, or :class:`Coded`; the offset zero where
    None, as in Q8_0) as ``(weights, factors)`` in the layout above: in 6 bits where every ``q`` lies in
    -32..31."""
    group = _check(q.shape[1], _groups(scale), (GROUP_SIZE, FINE_GROUP_SIZE))
    q = np.asarray(q, np.int8)
    if q.min() >= -NARROW and q.max() < NARROW:
        return _six_bit(q, group), _pack_factors(scale, offset, group, BIASES[6])
    return _interleaved(q, group), _pack_factors(scale, offset, group, BIASES[8])


def _six_bit(q: np.ndarray, group: int) -> np.ndarray:
    """``q + 32`` in the 6-bit layout: the runs' low nibbles in pairs, then their high two bits in fours."""
    runs = _interleaved((q.astype(np.int16) + NARROW).astype(np.uint8), group)  # [blocks, groups, n, 64]
    half, quarter = runs.shape[2] // 2, runs.shape[2] // 4
    nibbles = (runs[:, :, :half] & 15) | (runs[:, :, half:] << 4)
    crumbs = np.zeros_like(runs[:, :, :quarter])
    for s in range(4):
        crumbs |= (runs[:, :, s * quarter : (s + 1) * quarter] >> 4) << (2 * s)
    return np.ascontiguousarray(np.concatenate([nibbles, crumbs], axis=2))


@njit(inline="always")
def _largest(values):
    """The largest ``|v|`` of a group of :data:`GROUP_SIZE` values, over eight running maxima: one would chain
    every comparison to the one before it."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    for j in range(0, GROUP_SIZE, 8):
        a0, a1 = max(a0, abs(get(values, j))), max(a1, abs(get(values, j + 1)))
        a2, a3 = max(a2, abs(get(values, j + 2))), max(a3, abs(get(values, j + 3)))
        a4, a5 = max(a4, abs(get(values, j + 4))), max(a5, abs(get(values, j + 5)))
        a6, a7 = max(a6, abs(get(values, j + 6))), max(a7, abs(get(values, j + 7)))
    return max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))


@njit(inline="always")
def _quantize_row(x, t, group, high, low, token_factors):
    """Row ``t`` of :func:`quantize_rows`. Each loop indexes a slice from 0, so that LLVM knows no index
    wraps around and vectorises it."""
    row, row_high, row_low = x[t], high[t], low[t]
    for g in range(x.shape[1] // GROUP_SIZE):
        start = g * GROUP_SIZE
        largest = _largest(row[start : start + GROUP_SIZE])
        if largest < SMALLEST_STEP * LIMIT:
            largest = np.float32(0.0)  # such a group weighs nothing next to float32 rounding
        step = largest / LIMIT
        inverse = LIMIT / largest if largest > 0 else np.float32(0.0)
        for first in range(start, start + GROUP_SIZE, group):
            values = row[first : first + group]
            part_high, part_low = row_high[first : first + group], row_low[first : first + group]
            total = 0
            for j in range(group):
                v = np.int32(np.rint(get(values, j) * inverse))
                below = ((v + 128) & 255) - 128
                part_high[j], part_low[j] = np.int8((v - below) >> 8), np.int8(below)
                total += v
            token_factors[t, first // group, 0] = step
            token_factors[t, first // group, 1] = step * np.float32(total)


@njit(parallel=True, **_OPTIONS)
def _quantize_in_parallel(x, group, high, low, token_factors):
    for t in prange(x.shape[0]):
        _quantize_row(x, t, group, high, low, token_factors)


@njit(**_OPTIONS)
def quantize_rows(x, group):
    """Activation rows ``x`` ``[T, in]`` (float32 or bfloat16 bits) as ``v = 256 * high + low`` per group of
    32, ``high`` and ``low`` signed bytes ``[T, in]``, with ``token_factors`` ``[T, in // group, 2]``: for
    each group of ``group`` inputs (32 or 16), its step (that of the group of 32 it lies in), then the
    step times the sum of its ``v``. Rows go to the threads from :data:`PARALLEL_QUANTIZE_FROM` values."""
    rows, size = x.shape
    high, low = np.empty((rows, size), np.int8), np.empty((rows, size), np.int8)
    token_factors = np.empty((rows, size // group, 2), np.float32)
    if rows > 1 and rows * size >= PARALLEL_QUANTIZE_FROM:
        _quantize_in_parallel(x, group, high, low, token_factors)
    else:
        for t in range(rows):
            _quantize_row(x, t, group, high, low, token_factors)
    return high, low, token_factors


def _group_factors(weights, factors, g, r, table):
    """Group ``g``'s scale and minimum for row ``r`` of a block (``factors`` its factors) as float32
    (compiled only, see the overload)."""
    raise NotImplementedError


@overload(_group_factors, inline="always")
def _group_factors_overload(weights, factors, g, r, table):
    if factors.dtype == types.int8:
        unsigned = weights.dtype == types.uint8
        eight, four, six = (np.float32(BIASES[bits]) for bits in (8, 4, 6))

        def coded(weights, factors, g, r, table):
            bias = eight if not unsigned else (four if weights.shape[-2] == 4 else six)
            per = (factors.shape[1] - 4 * ROWS) // (2 * ROWS)
            line, at = factors[g // per], 4 * ROWS + (g % per) * 2 * ROWS + r

            def base(byte):
                return table[np.uint16(np.uint8(line[byte])) | (np.uint16(np.uint8(line[byte + 1])) << 8)]

            scale = base(2 * r) * np.float32(line[at])
            second = base(2 * ROWS + 2 * r) * np.float32(line[at + ROWS])
            return scale, second - bias * scale

        return coded
    if factors.dtype == types.uint16:
        return lambda weights, factors, g, r, table: (table[factors[g, 0, r]], table[factors[g, 1, r]])
    return lambda weights, factors, g, r, table: (np.float32(factors[g, 0, r]), np.float32(factors[g, 1, r]))


def _weight(weights, g, vector, byte):
    """Weight byte ``byte`` of a group's vector as the kernels multiply it: for 4-bit weights (uint8),
    ``vector`` counts the low nibbles' vectors then the high ones'; 8-bit ones read ``q + 128``
    (compiled only, see the overload)."""
    raise NotImplementedError


@overload(_weight, inline="always")
def _weight_overload(weights, g, vector, byte):
    if weights.dtype == types.uint8:

        def unsigned(weights, g, vector, byte):  # without branches, which inlining leaves Numba unsure of
            stored = weights.shape[-2]
            six_bit = np.int32(stored != 4)
            half = 4 - 2 * np.int32(stored == 3)  # vectors of nibbles
            quarter = half // 2
            nibble = (np.int32(weights[g, vector % half, byte]) >> (4 * (vector // half))) & 15
            high = np.int32(weights[g, min(half + vector % quarter, stored - 1), byte])
            return nibble | (((high >> (2 * (vector // quarter))) & 3) * six_bit << 4)

        return unsigned
    return lambda weights, g, vector, byte: np.int32(weights[g, vector, byte]) + 128


def vectors_of(weights):
    """Weight vectors (runs of four inputs) a group of ``weights`` (a block's, or all) multiplies: a
    4-bit group's four stored vectors hold eight, a 6-bit group's three hold four and six eight
    (compiled only, see the overload)."""
    raise NotImplementedError


@overload(vectors_of, inline="always")
def _vectors_of_overload(weights):
    if weights.dtype == types.uint8:
        return lambda weights: 8 if weights.shape[-2] == 4 else weights.shape[-2] * 4 // 3
    return lambda weights: weights.shape[-2]


def group_of(weights):
    """The inputs a group of ``weights`` spans (compiled only, see the overload)."""
    raise NotImplementedError


@overload(group_of, inline="always")
def _group_of_overload(weights):
    return lambda weights: vectors_of(weights) * LANE


@njit(parallel=True, **_OPTIONS)
def matmul(x, weights, factors, out):
    """``out`` ``[T, out]`` = ``x`` ``[T, in]`` times the transposed weights packed by :func:`pack4` or
    :func:`pack8`, in plain Numba: integer sums per group, then ``scale * step * sum + minimum * step *
    sum(v)`` in float32, rounded to ``out``'s dtype."""
    group = group_of(weights)
    high, low, token_factors = quantize_rows(x, group)
    values = high.astype(np.int32) * 256 + low.astype(np.int32)
    columns = out.shape[1]
    for b in prange(weights.shape[0]):
        block, block_factors = weights[b], factors[b]
        sums = np.empty(ROWS, np.int32)
        totals = np.empty(ROWS, np.float32)
        for t in range(x.shape[0]):
            totals[:] = 0
            for g in range(weights.shape[1]):
                sums[:] = 0
                for vector in range(vectors_of(block)):
                    v = values[t, g * group + vector * LANE :]
                    for r in range(ROWS):
                        byte = r * LANE
                        sums[r] += (
                            _weight(block, g, vector, byte) * v[0]
                            + _weight(block, g, vector, byte + 1) * v[1]
                            + _weight(block, g, vector, byte + 2) * v[2]
                            + _weight(block, g, vector, byte + 3) * v[3]
                        )
                step, summed = token_factors[t, g, 0], token_factors[t, g, 1]
                for r in range(ROWS):
                    scale, minimum = _group_factors(block, block_factors, g, r, FLOAT16_BITS_TO_FLOAT32)
                    totals[r] += np.float32(sums[r]) * (scale * step) + minimum * summed
            for r in range(min(ROWS, columns - b * ROWS)):
                put(out[t], b * ROWS + r, totals[r])


def group_vectors(builder, weights, g, vectors: int, unsigned: bool) -> list:
    """LLVM IR: group ``g``'s weight vectors of a block (``weights``: its Numba array struct, ``vectors``
    stored vectors a group, uint8 where ``unsigned``) as the kernels multiply them, ``<64 x i8>`` each,
    vector ``k`` holding inputs ``4k .. 4k + 3`` of the group: a 4-bit group's low nibbles' four vectors
    then its high ones', a 6-bit group's nibbles joined to their high two bits, an 8-bit group's bytes
    as ``q + 128`` (the sign bit flipped)."""
    bytes64 = ir.VectorType(ir.IntType(8), VECTOR)
    base = builder.mul(g, ir.Constant(ir.IntType(64), vectors * VECTOR))
    loaded = [
        builder.load(
            host.address(builder, weights, builder.add(base, ir.Constant(base.type, VECTOR * k)), bytes64), align=1
        )
        for k in range(vectors)
    ]
    if not unsigned:
        return [builder.xor(v, ir.Constant(bytes64, [-128] * VECTOR)) for v in loaded]

    def splat(value):
        return ir.Constant(bytes64, [value] * VECTOR)

    bits, runs = form_of(unsigned, vectors)
    half = runs // 2
    nibbles = [builder.and_(v, splat(15)) for v in loaded[:half]] + [builder.lshr(v, splat(4)) for v in loaded[:half]]
    if bits == 4:
        return nibbles
    quarter = runs // 4
    crumbs = [
        builder.and_(builder.lshr(loaded[half + k % quarter], splat(2 * (k // quarter))), splat(3)) for k in range(runs)
    ]
    return [builder.or_(n, builder.shl(c, splat(4))) for n, c in zip(nibbles, crumbs, strict=True)]


def factor_vectors(builder, factors, kind, g, group: int, bias: int) -> tuple:
    """LLVM IR: group ``g``'s sixteen scales and sixteen minimums of a block (``factors``: its Numba array
    struct, of Numba dtype ``kind``; groups of ``group`` inputs of a form with ``bias``), as two
    ``<16 x float>``."""
    floats = host.FLOATS
    if kind == types.int8:
        return _coded_vectors(builder, factors, g, group, bias)
    halves = kind == types.uint16

    def load(which):
        index = builder.add(builder.mul(g, ir.Constant(g.type, 2 * ROWS)), ir.Constant(g.type, ROWS * which))
        if halves:
            bits = builder.load(host.address(builder, factors, index, ir.VectorType(ir.IntType(16), ROWS)), align=1)
            return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), ROWS)), floats)
        return builder.load(host.address(builder, factors, index, floats), align=1)

    return load(0), load(1)


def prefetch_group(builder, weights, factors, kind, g, vectors: int, group: int) -> None:
    """LLVM IR: ask the caches for group ``g``'s weights and factors of a block (as :func:`group_vectors`
    and :func:`factor_vectors` take them) ahead of their loads; past the block's end, the next block's."""
    i8, i64 = ir.IntType(8), g.type
    fetch = host.declare(builder.module, "llvm.prefetch.p0", ir.VoidType(), [i8.as_pointer()] + [ir.IntType(32)] * 3)

    def ask(array, index):  # a read, kept in every cache level, of data
        line = host.address(builder, array, index, i8)
        builder.call(fetch, [line] + [ir.Constant(ir.IntType(32), value) for value in (0, 3, 1)])

    first = builder.mul(g, ir.Constant(i64, vectors * VECTOR))
    for k in range(vectors):
        ask(weights, builder.add(first, ir.Constant(i64, VECTOR * k)))
    if kind == types.int8:  # the super-block's bases, then the group's codes
        for place in _coded_place(builder, g, group):
            ask(factors, place)
    else:  # 2 x 16 float16 bits or floats: one line or two
        start = builder.mul(g, ir.Constant(i64, 2 * ROWS))
        ask(factors, start)
        if kind == types.float32:
            ask(factors, builder.add(start, ir.Constant(i64, ROWS)))


def _coded_place(builder, g, group: int) -> tuple:
    """LLVM IR: the byte offsets, in a block's coded factors, of group ``g``'s super-block bases and of
    its codes."""
    i64 = g.type
    per = SUPER_SIZE // group
    line = builder.mul(builder.udiv(g, ir.Constant(i64, per)), ir.Constant(i64, 4 * ROWS + per * 2 * ROWS))
    within = builder.mul(builder.urem(g, ir.Constant(i64, per)), ir.Constant(i64, 2 * ROWS))
    return line, builder.add(builder.add(line, ir.Constant(i64, 4 * ROWS)), within)


def _coded_vectors(builder, factors, g, group: int, bias: int) -> tuple:
    """:func:`factor_vectors` for coded factors: each factor one float32 product of its base and code."""
    floats, i64 = host.FLOATS, g.type
    line, at = _coded_place(builder, g, group)

    def factor(which):
        place = builder.add(line, ir.Constant(i64, 2 * ROWS * which))
        bits = builder.load(host.address(builder, factors, place, ir.VectorType(ir.IntType(16), ROWS)), align=1)
        base = builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), ROWS)), floats)
        place = builder.add(at, ir.Constant(i64, ROWS * which))
        codes = builder.load(host.address(builder, factors, place, ir.VectorType(ir.IntType(8), ROWS)), align=1)
        return builder.fmul(base, builder.sitofp(codes, floats))

    scale, second = factor(0), factor(1)
    if not bias:
        return scale, second
    return scale, builder.fsub(second, builder.fmul(scale, ir.Constant(floats, [float(bias)] * ROWS)))


def _make_widen(vectors: int):
    """An intrinsic that widens group ``g`` of one block (its ``vectors`` stored vectors, as :func:`pack4`
    or :func:`pack8` lay them out) into ``columns`` ``[in, width]`` (float32, or bfloat16 bits rounded to
    nearest even), the block's sixteen output rows as sixteen adjacent columns from ``column``: ``scale *
    q + minimum`` (``q + 128`` for 8-bit weights). Plain LLVM vector operations, which LLVM lowers for
    any CPU: a vector's 64 bytes become sixteen rows' four inputs as floats, regrouped into four runs of
    sixteen rows, each stored whole into its input's row of ``columns``."""

    def codegen(context, builder, signature, args):
        weights, factors, columns = (
            context.make_array(t)(context, builder, a) for t, a in zip(signature.args[:3], args[:3], strict=True)
        )
        column, g = args[3], args[4]
        i16, i32, i64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
        floats, words = host.FLOATS, ir.VectorType(i32, ROWS)
        unsigned = signature.args[0].dtype == types.uint8
        bits, runs = form_of(unsigned, vectors)
        bfloat16 = signature.args[2].dtype == types.uint16
        group = runs * LANE
        width = cgutils.unpack_tuple(builder, columns.shape)[1]
        start = builder.mul(g, ir.Constant(i64, group))

        def lanes(values):
            return ir.Constant(ir.VectorType(i32, len(values)), values)

        scale, minimum = factor_vectors(builder, factors, signature.args[1].dtype, g, group, BIASES[bits])
        # quarter q of a vector holds rows 4q .. 4q + 3, four inputs each: each row's factor over its four
        spread = [lanes([4 * q + lane // 4 for lane in range(16)]) for q in range(4)]
        scales = [builder.shuffle_vector(scale, scale, mask) for mask in spread]
        minimums = [builder.shuffle_vector(minimum, minimum, mask) for mask in spread]
        for k, values in enumerate(group_vectors(builder, weights, g, vectors, unsigned)):
            first = LANE * k
            wide = builder.zext(values, ir.VectorType(i32, VECTOR))
            quarters = []
            for q in range(4):
                quarter = builder.uitofp(
                    builder.shuffle_vector(wide, wide, lanes(list(range(16 * q, 16 * q + 16)))), floats
                )
                product = builder.fmul(quarter, scales[q], flags=["contract"])
                quarters.append(builder.fadd(product, minimums[q], flags=["contract"]))
            for i in range(LANE):  # input i of the four: rows 0..15 from lanes i, 4 + i, ...
                pick = [4 * row + i for row in range(4)] + [16 + 4 * row + i for row in range(4)]
                low = builder.shuffle_vector(quarters[0], quarters[1], lanes(pick))
                high = builder.shuffle_vector(quarters[2], quarters[3], lanes(pick))
                run = builder.shuffle_vector(low, high, lanes(list(range(16))))
                line = builder.add(start, ir.Constant(i64, first + i))
                index = builder.add(builder.mul(line, width), column)
                if bfloat16:  # round to nearest even, as elements.float32_to_bfloat16
                    bits = builder.bitcast(run, words)
                    odd = builder.and_(
                        builder.lshr(bits, ir.Constant(words, [16] * ROWS)), ir.Constant(words, [1] * ROWS)
                    )
                    rounded = builder.add(builder.add(bits, ir.Constant(words, [0x7FFF] * ROWS)), odd)
                    halves = builder.trunc(
                        builder.lshr(rounded, ir.Constant(words, [16] * ROWS)), ir.VectorType(i16, ROWS)
                    )
                    builder.store(halves, host.address(builder, columns, index, ir.VectorType(i16, ROWS)), align=2)
                else:
                    builder.store(run, host.address(builder, columns, index, floats), align=4)
        return context.get_dummy_value()

    def widen(typingctx, weights, factors, columns, column, g):
        return types.void(weights, factors, columns, column, g), codegen

    return intrinsic(widen)


def forms_of(weights) -> tuple[int, int, int]:
    """The stored vectors a group of each form of a Numba array type's dtype (:data:`STORED`), as three
    (the last repeated): the branches a dispatch on a block's form compiles, none for the other dtype's."""
    return (STORED[weights.dtype] * 2)[:3]


STORED = {types.uint8: (4, 6, 3), types.int8: (8, 4)}  # stored vectors a group of each weight dtype's forms
_WIDEN = {stored: _make_widen(stored) for stored in (3, 4, 6, 8)}


def _widen(block, factors, columns, column, g):
    """:func:`_make_widen`'s intrinsic for ``block``'s form (compiled only, see the overload)."""
    raise NotImplementedError


@overload(_widen, inline="always")
def _widen_overload(block, factors, columns, column, g):
    first, second, third = forms_of(block)
    one, two, three = _WIDEN[first], _WIDEN[second], _WIDEN[third]

    def widen(block, factors, columns, column, g):
        stored = block.shape[1]
        if stored == first:
            one(block, factors, columns, column, g)
        elif stored == second:
            two(block, factors, columns, column, g)
        else:
            three(block, factors, columns, column, g)

    return widen


@njit(parallel=True, **_OPTIONS)
def unpack_columns(weights, factors, first, columns):
    """The weights of blocks ``first`` on, transposed: ``columns`` ``[in, width]`` (float32 or bfloat16
    bits), column ``c`` = output row ``16 * first + c``, for as many whole blocks as ``width`` (a
    multiple of 16) holds, or up to the last block. A dense matmul takes ``columns`` as the transposed
    weights; the stores are whole runs of sixteen, where rows of the weights would take four at a time."""
    blocks = min(columns.shape[1] // ROWS, weights.shape[0] - first)
    for g in prange(weights.shape[1]):  # a group's rows of ``columns`` are written whole, left to right
        for n in range(blocks):
            _widen(weights[first + n], factors[first + n], columns, n * ROWS, g)


@njit(parallel=True, **_OPTIONS)
def _unpack(weights, factors, rows, out):
    """Each row widened from its block's columns, a block at a time into a scratch tile."""
    for n in prange(rows.shape[0]):
        b, r = rows[n] // ROWS, rows[n] % ROWS
        scratch = np.empty((out.shape[1], ROWS), np.float32)
        block, block_factors, line = weights[b], factors[b], out[n]
        for g in range(weights.shape[1]):
            _widen(block, block_factors, scratch, 0, g)
        for c in range(line.shape[0]):
            put(line, c, scratch[c, r])


def unpack(weights: np.ndarray, factors: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[n]`` = the weights of output row ``rows[n]`` (int64 indices), ``out`` ``[len(rows), in]``
    float32 or bfloat16 bits (``uint16``): one float32 multiply-add per weight, as the dequantized form
    computes it (fused or not, as LLVM picks)."""
    _unpack(weights, factors, np.asarray(rows, np.int64), out)
