"""Group-quantized 4-bit (and 8-bit) weights times a few activation rows, with AVX-512 VNNI integer dot products.

A decode step at batch 1 multiplies each weight once. torch's packed int4
kernel widens every weight to float32 first and is bound by that arithmetic,
not by reading the weights. Here each weight stays an integer:

- The activations of a row are quantized per group of :data:`GROUP_SIZE` to
  16-bit integers, ``x = step * v`` with ``|v| <= 32767`` (the group's
  largest magnitude maps to 32767). That is over a hundred times finer than
  rounding them to bfloat16, so results are closer to float32 than torch's
  bfloat16 kernel.
- ``v`` is split into its signed high byte and unsigned low byte,
  ``v = 256 * high + low``, so that ``vpdpbusd`` (64 products of an
  unsigned and a signed byte, summed in fours into 32-bit lanes) can take
  both: the weights ``q`` (0..15) times ``high``, ``low`` times ``q``. The
  integer sums are exact.
- Each group's sum is scaled in float32: ``scale * step * sum(q * v) +
  minimum * sum(x)`` for weights ``w = scale * q + minimum``.

Weights are packed in pairs of groups, 32 bytes for 64 inputs: byte ``j``
holds input ``j`` in its low nibble and input ``32 + j`` in its high nibble
(:func:`pack`). The input size must be a multiple of 64.

8-bit weights (GGUF's Q8_0, :func:`pack8`, :func:`matmul8`) go the same
way, each byte whole: see :data:`_dot8`. Their factors may instead belong to
groups of :data:`FINE_GROUP_SIZE` (GGUF's Q6_K and Q2_K scale every 16
inputs on their own): ``vpdpbusd``'s 32-bit lanes each sum four inputs in
order, so a 16-input group is four lanes, given its own scale and minimum
before the lanes are added up.

:data:`SUPPORTED` says whether this machine can run it (AVX-512 BW and VNNI,
with Numba compiling for the host CPU). Activations and outputs are float32
or bfloat16 bits (``uint16``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from hetero_kernels import host
from hetero_kernels.elements import get, put

GROUP_SIZE = 32
PAIR = 2 * GROUP_SIZE  # inputs per 64-byte vector: two groups
FINE_GROUP_SIZE = 16  # the finer groups pack8 takes factors for
_OPTIONS = dict(fastmath=True, cache=True)
SMALLEST_STEP = np.float32(1e-30)  # finer steps would overflow their inverse


SUPPORTED = host.has("avx512bw", "avx512vnni")


def pack(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``scale * q + minimum`` (``q`` ``[out, in]`` 0..15, ``in`` a multiple of 64; ``scale``
    and ``minimum`` ``[out, in // 32]``) as the kernel's bytes ``[out, in // 2]`` and factors
    ``[out, in // 64, 4]``: each pair's two scales and two minimums, in float16 (as its bits, ``uint16``)
    where that holds them exactly (GGUF stores them so), else float32."""
    rows, size = q.shape
    if size % PAIR:
        raise ValueError(f"input size {size} is not a multiple of {PAIR}")
    packed = np.empty((rows, size // 2), np.uint8)
    # Numba, not numpy's whole-array ops, which are slower at load (docs/design/2026-11-26-cpu-int4-linear-kernels.md)
    _pack_nibbles(np.asarray(q, np.uint8), packed)
    return packed, _factors(np.asarray(scale, np.float32), np.asarray(minimum, np.float32), size // PAIR)


def pack8(q: np.ndarray, scale: np.ndarray, offset: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """8-bit weights ``scale * q + offset`` (``q`` ``[out, in]`` int8, ``in`` a multiple of 64; ``scale``
    and ``offset`` ``[out, in // 32]``, or ``[out, in // 16]`` for groups of :data:`FINE_GROUP_SIZE`,
    the offset zero where None, as in GGUF's Q8_0) for :func:`matmul8`: the bytes as they are, and
    factors laid out as :func:`pack` lays them (``[out, in // 64, 4]``; for groups of 16, each pair's
    four scales then four minimums, ``[out, in // 64, 2, 4]``), with ``offset - 128 * scale`` as the
    minimums (see :func:`matmul8`)."""
    rows, size = q.shape
    if size % PAIR:
        raise ValueError(f"input size {size} is not a multiple of {PAIR}")
    if scale.shape[1] not in (size // GROUP_SIZE, size // FINE_GROUP_SIZE):
        raise ValueError(
            f"{scale.shape[1]} factors per row of {size} inputs:"
            f" groups must be {GROUP_SIZE} or {FINE_GROUP_SIZE} inputs"
        )
    scale = np.asarray(scale, np.float32)
    minimum = np.float32(-128.0) * scale
    if offset is not None:
        minimum = minimum + np.asarray(offset, np.float32)
    return np.ascontiguousarray(q, np.int8), _factors(scale, minimum, size // PAIR)


def _factors(scale: np.ndarray, minimum: np.ndarray, pairs: int) -> np.ndarray:
    """Each pair's scales then its minimums, ``[out, pairs, 4]`` for two groups a pair or ``[out, pairs,
    2, 4]`` for four: float16 bits where every one is exact in float16 (GGUF's own scales are), else
    float32."""
    rows, per_pair = scale.shape[0], scale.shape[1] // pairs
    factors = np.concatenate([scale.reshape(rows, pairs, per_pair), minimum.reshape(rows, pairs, per_pair)], axis=2)

    def as_halves(values: np.ndarray) -> np.ndarray | None:
        with np.errstate(over="ignore"):  # beyond float16's range: inf, which compares unequal
            halves = values.astype(np.float16)
        return halves.view(np.uint16) if np.array_equal(halves.astype(np.float32), values) else None

    # a row's worth first: a layer whose factors are products (Q4_K's) fails there, without a pass over all
    halves = as_halves(factors) if as_halves(factors[:1]) is not None else None
    packed = factors if halves is None else halves
    return packed if per_pair == 2 else packed.reshape(rows, pairs, 2, per_pair)


@njit(parallel=True, **_OPTIONS)
def _pack_nibbles(q, packed):
    for r in prange(q.shape[0]):
        for pair in range(q.shape[1] // PAIR):
            first, second, out = q[r, pair * PAIR :], q[r, pair * PAIR + GROUP_SIZE :], packed[r, pair * GROUP_SIZE :]
            for j in range(GROUP_SIZE):
                out[j] = first[j] | (second[j] << 4)


def _vector(element: ir.Type, count: int) -> ir.VectorType:
    return ir.VectorType(element, count)


_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
_LANES = _vector(_I32, 16)  # one 512-bit register as vpdpbusd sees it
_FLOATS = _vector(_F32, 16)


def load(builder: ir.IRBuilder, array, index: ir.Value, count: int, vector: ir.Type) -> ir.Value:
    """``count`` elements of ``array`` from element ``index``, read as one ``vector`` (unaligned)."""
    address = builder.gep(array.data, [builder.mul(index, ir.Constant(_I64, count))])
    return builder.load(builder.bitcast(address, vector.as_pointer()), align=1)


def _sum_over(builder: ir.IRBuilder, count: ir.Value, term) -> ir.Value:
    """The sum of ``term(i)`` (a float vector) over ``i`` in ``0..count-1``, emitted as a loop."""
    function = builder.function
    entry = builder.block
    loop, done = function.append_basic_block("pairs"), function.append_basic_block("summed")
    zero = ir.Constant(_FLOATS, None)
    builder.cbranch(builder.icmp_signed(">", count, ir.Constant(_I64, 0)), loop, done)
    builder.position_at_end(loop)
    i, total = builder.phi(_I64), builder.phi(_FLOATS)
    following, grown = builder.add(i, ir.Constant(_I64, 1)), builder.fadd(total, term(i), flags=["fast"])
    i.add_incoming(ir.Constant(_I64, 0), entry)
    i.add_incoming(following, loop)
    total.add_incoming(zero, entry)
    total.add_incoming(grown, loop)
    builder.cbranch(builder.icmp_signed("<", following, count), loop, done)
    builder.position_at_end(done)
    result = builder.phi(_FLOATS)
    result.add_incoming(zero, entry)
    result.add_incoming(grown, loop)
    return result


def _make_dot(eight_bit: bool):
    """The dot product of one weight row with one quantized activation row (see :func:`_dot`): of 4-bit
    weights packed by :func:`pack`, or with ``eight_bit``, of 8-bit ones from :func:`pack8` (their
    factors' shape, ``[pairs, 2, 4]``, says groups of 16)."""

    def codegen(context, builder, signature, args):
        row, highs, lows, scales, steps = (
            context.make_array(t)(context, builder, a) for t, a in zip(signature.args, args, strict=True)
        )
        pairs = cgutils.unpack_tuple(builder, scales.shape)[0]
        dot_bytes = host.declare(builder.module, "llvm.x86.avx512.vpdpbusd.512", _LANES, [_LANES] * 3)
        zero_lanes = ir.Constant(_LANES, None)
        groups = 4 if signature.args[3].ndim == 3 else 2  # a pair's groups: each has 16 // groups lanes
        width = 2 * groups  # the factors of a pair: its scales, then its minimums
        halves = signature.args[3].dtype == types.uint16  # float16 bits

        def spread(factors, first):
            lanes = [first + lane * groups // 16 for lane in range(16)]
            return builder.shuffle_vector(factors, factors, ir.Constant(_vector(_I32, 16), lanes))

        def pair(p):
            if eight_bit:  # q + 128, unsigned: the sign bit flipped
                q = builder.bitcast(
                    builder.xor(
                        load(builder, row, p, 64, _vector(_I8, 64)), ir.Constant(_vector(_I8, 64), [-128] * 64)
                    ),
                    _LANES,
                )
                lower = builder.call(dot_bytes, [zero_lanes, q, load(builder, lows, p, 64, _LANES)])
            else:
                packed = load(builder, row, p, 32, _vector(_I8, 32))
                first = builder.and_(packed, ir.Constant(_vector(_I8, 32), [15] * 32))
                second = builder.lshr(packed, ir.Constant(_vector(_I8, 32), [4] * 32))
                q = builder.bitcast(
                    builder.shuffle_vector(first, second, ir.Constant(_vector(_I32, 64), list(range(64)))), _LANES
                )
                lower = builder.call(dot_bytes, [zero_lanes, load(builder, lows, p, 64, _LANES), q])
            upper = builder.call(dot_bytes, [zero_lanes, q, load(builder, highs, p, 64, _LANES)])
            sums = builder.sitofp(builder.add(builder.shl(upper, ir.Constant(_LANES, [8] * 16)), lower), _FLOATS)
            floats = _vector(_F32, width)
            if halves:
                weight = builder.fpext(
                    builder.bitcast(
                        load(builder, scales, p, width, _vector(ir.IntType(16), width)), _vector(ir.HalfType(), width)
                    ),
                    floats,
                )
            else:
                weight = load(builder, scales, p, width, floats)
            factors = builder.fmul(weight, load(builder, steps, p, width, floats))
            return builder.fadd(
                builder.fmul(sums, spread(factors, 0), flags=["fast"]), spread(factors, groups), flags=["fast"]
            )

        total = _sum_over(builder, pairs, pair)
        reduce = host.declare(builder.module, "llvm.vector.reduce.fadd.v16f32", _F32, [_F32, _FLOATS])
        return builder.call(reduce, [ir.Constant(_F32, 0.0), total], fastmath=("reassoc",))

    def dot(typingctx, weights, high, low, weight_factors, token_factors):
        return types.float32(weights, high, low, weight_factors, token_factors), codegen

    return intrinsic(dot)


_dot = _make_dot(False)
"""One packed weight row times one quantized activation row, as float32, one 64-input pair of groups
per loop iteration: ``scale * step * sum(q * (256 * high + low)) + minimum * sum(x)`` for each group,
the integer sums by ``vpdpbusd``. ``weight_factors`` ``[pairs, 4]`` (float16 bits or float32) hold each
pair's two scales then two minimums, ``token_factors`` ``[pairs, 4]`` the two steps then the two sums
over 8 (each group's 16-lane half has 8 lanes to spread its offset over)."""

_dot8 = _make_dot(True)
"""The same for 8-bit weights ``q``, read as ``q + 128`` (unsigned, as ``vpdpbusd`` takes its first
operand) against activations whose low byte is signed too: ``sum((q + 128) * v) = sum(q * v) + 128 *
sum(v)``, so the minimums ``-128 * scale`` that :func:`pack8` stores take the offset back out. With
groups of 16 (factors ``[pairs, 2, 4]``), ``token_factors`` are ``[pairs, 8]``: each group's step
(of the group of 32 it lies in), then each group's sum over 4."""


@njit(**_OPTIONS)
def _quantize(x, high, low, factors, signed_low):
    """One activation row into ``v = 256 * high + low`` per group of 32, with each pair's :func:`_dot`
    factors: the two steps, then the two groups' sums over 8 (``factors`` ``[pairs, 4]``); or for
    weights in groups of 16 (``[pairs, 8]``) each such group's step, then its sum over 4. ``low`` is
    unsigned (0..255), or with ``signed_low`` signed (-128..127, stored as its byte; the largest
    magnitude is then 32639, so that ``high`` stays within -127..127), and the sums are then ``step *
    sum(v)``, exactly what :func:`_dot8`'s offset added, rather than ``sum(x)``."""
    limit = np.float32(32639.0) if signed_low else np.float32(32767.0)
    fine = factors.shape[1] == 8
    for g in range(2 * factors.shape[0]):
        start = g * GROUP_SIZE
        largest = np.float32(0.0)
        for j in range(start, start + GROUP_SIZE):
            largest = max(largest, abs(get(x, j)))
        if largest < SMALLEST_STEP * limit:
            largest = np.float32(0.0)  # such a group weighs nothing next to float32 rounding; its sum still counts
        step = largest / limit
        inverse = limit / largest if largest > 0 else np.float32(0.0)
        pair, side = g // 2, g % 2
        whole_total, whole_quantized = np.float32(0.0), 0
        for half in range(2):  # each half's sum: of x, or with signed_low step times that of v
            total, quantized = np.float32(0.0), 0
            for j in range(start + half * FINE_GROUP_SIZE, start + (half + 1) * FINE_GROUP_SIZE):
                value = get(x, j)
                v = np.int32(np.rint(value * inverse))
                total, quantized = total + value, quantized + v
                if signed_low:
                    below = ((v + 128) & 255) - 128
                    high[j], low[j] = np.int8((v - below) >> 8), np.uint8(below & 255)
                else:
                    high[j], low[j] = np.int8(v >> 8), np.uint8(v & 255)
            whole_total, whole_quantized = whole_total + total, whole_quantized + quantized
            if fine:
                part = step * np.float32(quantized) if signed_low else total
                factors[pair, 2 * side + half] = step
                factors[pair, 4 + 2 * side + half] = part / np.float32(4.0)
        if not fine:
            factors[pair, side] = step
            factors[pair, 2 + side] = (step * np.float32(whole_quantized) if signed_low else whole_total) / np.float32(
                8.0
            )


@njit(**_OPTIONS)
def _quantize_rows(x, signed_low, fine):
    """Every activation row through :func:`_quantize`: ``(high, low, token_factors)``, the factors for
    weights in groups of 16 with ``fine``."""
    rows, size = x.shape
    high, low = np.empty((rows, size), np.int8), np.empty((rows, size), np.uint8)
    token_factors = np.empty((rows, size // PAIR, 8 if fine else 4), np.float32)
    for t in range(rows):
        _quantize(x[t], high[t], low[t], token_factors[t], signed_low)
    return high, low, token_factors


# matmul and matmul8 differ only in their dot product. They are two functions, not two closures of one
# factory: Numba keys a closure's cache entries by a hash of its cells' pickles, which for the intrinsics
# differed from process to process, so every start compiled them again.


@njit(parallel=True, **_OPTIONS)
def matmul(x, weights, factors, out):
    """``out`` ``[T, out]`` = ``x`` ``[T, in]`` times the transposed weights packed by :func:`pack`, rounded
    to ``out``'s dtype. Rows of weights are shared out among the threads; each is read once for all ``T``
    activation rows."""
    high, low, token_factors = _quantize_rows(x, False, False)
    for r in prange(weights.shape[0]):
        for t in range(x.shape[0]):
            put(out[t], r, _dot(weights[r], high[t], low[t], factors[r], token_factors[t]))


@njit(parallel=True, **_OPTIONS)
def matmul8(x, weights, factors, out):
    """The same for 8-bit weights from :func:`pack8` (groups of 32 or 16): one ``vpdpbusd`` per 64
    products and activation byte, where the 8-bit weights as two 4-bit halves take two."""
    high, low, token_factors = _quantize_rows(x, True, factors.ndim == 4)
    for r in prange(weights.shape[0]):
        for t in range(x.shape[0]):
            put(out[t], r, _dot8(weights[r], high[t], low[t], factors[r], token_factors[t]))
