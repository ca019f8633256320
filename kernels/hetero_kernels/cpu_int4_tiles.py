"""Group-quantized 4-bit weights times a handful of bfloat16 activation rows, with AVX-512 BF16 dot products.

A decode step of a few sequences (3 to a few dozen rows) sits between the
two other int4 paths: torch's packed kernel and :mod:`hetero_kernels.cpu_int4`
cost about linearly in the rows (each row re-reads and re-widens the
weights), while the dense bfloat16 matmul streams four times the bytes of
the packed weights from memory. Here each widened weight serves a tile of
up to eight rows:

- A weight ``q`` (0..15) becomes the bfloat16 number ``128 + q``, exactly:
  bfloat16 holds the whole numbers 128..255 with the bits ``0x4300 | q``, so
  widening is a mask (or shift) and an interleave with the byte ``0x43``.
- ``vdpbf16ps`` multiplies sixteen outputs' weights by a pair of inputs of
  one row (broadcast), summing the products in float32. The products of two
  bfloat16 numbers are exact, so each group's sum only rounds as float32
  sums do: the weights are not rounded to bfloat16 as the dense copy's are.
- Each group's sum is scaled in float32, ``scale * sum((128 + q) * x) +
  (minimum - 128 * scale) * sum(x)``, for weights ``w = scale * q +
  minimum``.

A work item is sixteen outputs times a tile of rows (:data:`TILE_ROWS`, or
:data:`SHORT_TILE_ROWS` for the last few), accumulated over every group in
registers; items are shared out among the threads. Weights are packed per
sixteen outputs and group, 256 bytes (:func:`pack`). The output size must be
a multiple of 16 and the input size of 32.

:data:`SUPPORTED` says whether this machine can run it (AVX-512 BW and
BF16, with Numba compiling for the host CPU). Activations are bfloat16 bits
(``uint16``); outputs are float32 or bfloat16 bits.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetero_kernels import host
from hetero_kernels.elements import get

GROUP_SIZE = 32
OUTPUTS = 16  # outputs per work item: one float32 vector
TILE_ROWS = 8  # rows per work item: 8 running sums and 8 group sums stay in registers
SHORT_TILE_ROWS = 4  # for a last tile of up to 4 rows
PACKED_BYTES = OUTPUTS * GROUP_SIZE // 2  # one group of sixteen outputs, two weights a byte
_OPTIONS = dict(fastmath=True, cache=True)


SUPPORTED = host.has("avx512bw", "avx512bf16")


def _byte_of(pair: int, word: int) -> tuple[int, int]:
    """Where the weight widened into ``word`` (0..31) of a group's ``pair``-th vector (0..15) is packed:
    ``(byte, shift)`` within the group's 256 bytes.

    The group is read as four 64-byte chunks; each chunk's low nibbles, then its high nibbles, give two
    vectors each by interleaving with ``0x43``: the low eight bytes of every 16-byte lane, then the
    high eight (what ``vpunpcklbw`` / ``vpunpckhbw`` take). Word ``w`` of a vector is input ``w % 2``
    of the pair for output ``w // 2``."""
    chunk, vector = divmod(pair, 4)
    lane, index = divmod(word, 8)
    return 64 * chunk + 16 * lane + index + 8 * (vector % 2), 4 * (vector // 2)


_LAYOUT = np.array([[_byte_of(p, w) for w in range(2 * OUTPUTS)] for p in range(GROUP_SIZE // 2)], np.int64)


def pack(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``scale * q + minimum`` (``q`` ``[out, in]`` 0..15; ``scale`` and ``minimum``
    ``[out, in // 32]``) as the kernel's bytes ``[out // 16, in // 32, 256]`` and factors ``[out // 16,
    in // 32, 32]``: each group's sixteen scales, then its sixteen ``minimum - 128 * scale``."""
    outputs, size = q.shape
    if outputs % OUTPUTS or size % GROUP_SIZE:
        raise ValueError(
            f"weights {outputs}x{size}: the outputs must be a multiple of {OUTPUTS},"
            f" the inputs a multiple of {GROUP_SIZE}"
        )
    packed = np.zeros((outputs // OUTPUTS, size // GROUP_SIZE, PACKED_BYTES), np.uint8)
    _pack_nibbles(np.asarray(q, np.uint8), _LAYOUT, packed)
    scale = np.asarray(scale, np.float32)
    offset = np.asarray(minimum, np.float32) - np.float32(128.0) * scale
    factors = np.concatenate([_by_tile(scale), _by_tile(offset)], axis=2)
    return packed, np.ascontiguousarray(factors)


def _by_tile(values: np.ndarray) -> np.ndarray:
    """``[out, groups]`` as ``[out // 16, groups, 16]``."""
    return values.reshape(-1, OUTPUTS, values.shape[1]).transpose(0, 2, 1)


@njit(parallel=True, **_OPTIONS)
def _pack_nibbles(q, layout, packed):
    for tile in prange(packed.shape[0]):
        for group in range(packed.shape[1]):
            out = packed[tile, group]
            for pair in range(layout.shape[0]):
                for word in range(layout.shape[1]):
                    byte, shift = layout[pair, word]
                    out[byte] |= np.uint8(
                        q[tile * OUTPUTS + word // 2, group * GROUP_SIZE + 2 * pair + word % 2] << shift
                    )


_I8, _I32, _I64, _BF16 = ir.IntType(8), ir.IntType(32), ir.IntType(64), host.BFloat16()
_FLOATS, _WEIGHTS = host.FLOATS, host.BFLOAT16_PAIRS


def _make_tile(rows: int):
    """The intrinsic computing one work item: sixteen outputs (``tile``) for ``rows`` activation rows
    from ``first`` (rows past the last repeat it)."""

    def codegen(context, builder, signature, args):
        packed, factors, x, sums, out = (
            context.make_array(t)(context, builder, a) for t, a in zip(signature.args[:5], args[:5], strict=True)
        )
        tile, first = args[5], args[6]
        groups = cgutils.unpack_tuple(builder, packed.shape)[1]
        steps, size = cgutils.unpack_tuple(builder, x.shape)
        last_row = builder.sub(steps, ir.Constant(_I64, 1))
        outputs = cgutils.unpack_tuple(builder, out.shape)[1]
        row_of = [
            builder.select(builder.icmp_signed("<", t, last_row), t, last_row)
            for t in (builder.add(first, ir.Constant(_I64, r)) for r in range(rows))
        ]
        fma = host.declare(builder.module, "llvm.fma.v16f32", _FLOATS, [_FLOATS] * 3)
        zero, index = ir.Constant(_FLOATS, None), lambda n: ir.Constant(_I64, n)
        exponent, low_nibbles = host.constant(_I8, [0x43] * 64), host.constant(_I8, [0x0F] * 64)
        pair_words = [builder.bitcast(builder.gep(x.data, [builder.mul(r, size)]), _I32.as_pointer()) for r in row_of]

        def vector_at(array, element, vector_type):
            return builder.load(builder.bitcast(builder.gep(array.data, [element]), vector_type.as_pointer()), align=1)

        entry, loop, done = builder.block, builder.append_basic_block("groups"), builder.append_basic_block("stored")
        builder.branch(loop)
        builder.position_at_end(loop)
        group = builder.phi(_I64)
        running = [builder.phi(_FLOATS) for _ in range(rows)]
        item = builder.add(builder.mul(tile, groups), group)
        partial = [zero] * rows
        for chunk in range(4):
            data = vector_at(
                packed, builder.add(builder.mul(item, index(PACKED_BYTES)), index(64 * chunk)), ir.VectorType(_I8, 64)
            )
            nibbles = (builder.and_(data, low_nibbles), builder.lshr(data, host.constant(_I8, [4] * 64)))
            for vector in range(4):
                lanes = [byte for word in range(32) for byte in (16 * (word // 8) + word % 8 + 8 * (vector % 2), 64)]
                weights = builder.bitcast(
                    builder.shuffle_vector(nibbles[vector // 2], exponent, host.constant(_I32, lanes)), _WEIGHTS
                )
                pair = builder.add(builder.mul(group, index(GROUP_SIZE // 2)), index(4 * chunk + vector))
                for r in range(rows):
                    inputs = host.splat(
                        builder, builder.load(builder.gep(pair_words[r], [pair]), align=4), ir.VectorType(_I32, 16)
                    )
                    partial[r] = host.dot_bfloat16(builder, partial[r], weights, builder.bitcast(inputs, _WEIGHTS))
        scale = vector_at(factors, builder.mul(item, index(32)), _FLOATS)
        offset = vector_at(factors, builder.add(builder.mul(item, index(32)), index(16)), _FLOATS)
        grown = []
        for r in range(rows):
            total = builder.load(builder.gep(sums.data, [builder.add(builder.mul(row_of[r], groups), group)]))
            grown.append(
                builder.call(
                    fma,
                    [offset, host.splat(builder, total, _FLOATS), builder.call(fma, [partial[r], scale, running[r]])],
                )
            )
        following = builder.add(group, index(1))
        group.add_incoming(index(0), entry)
        group.add_incoming(following, builder.block)
        for phi, value in zip(running, grown, strict=True):
            phi.add_incoming(zero, entry)
            phi.add_incoming(value, builder.block)
        builder.cbranch(builder.icmp_signed("<", following, groups), loop, done)
        builder.position_at_end(done)
        as_bfloat16 = signature.args[4].dtype == types.uint16
        for r in range(rows):
            value = builder.fptrunc(grown[r], ir.VectorType(_BF16, 16)) if as_bfloat16 else grown[r]
            address = builder.gep(
                out.data, [builder.add(builder.mul(row_of[r], outputs), builder.mul(tile, index(OUTPUTS)))]
            )
            builder.store(value, builder.bitcast(address, value.type.as_pointer()), align=1)
        return context.get_dummy_value()

    def work_item(typingctx, packed, factors, x, sums, out, tile, first):
        expected = {
            "packed": (packed, (types.uint8,), 3),
            "factors": (factors, (types.float32,), 3),
            "x": (x, (types.uint16,), 2),
            "out": (out, (types.float32, types.uint16), 2),
        }
        for name, (array, dtypes, ndim) in expected.items():
            if not (
                isinstance(array, types.Array) and array.layout == "C" and array.ndim == ndim and array.dtype in dtypes
            ):
                raise TypingError(
                    f"cpu_int4_tiles.matmul: {name} must be a contiguous {ndim}-D array"
                    f" of {' or '.join(map(str, dtypes))}, got {array}"
                )
        return types.void(packed, factors, x, sums, out, types.int64, types.int64), codegen

    return intrinsic(work_item)


_tile = _make_tile(TILE_ROWS)
_short_tile = _make_tile(SHORT_TILE_ROWS)


@njit(parallel=True, **_OPTIONS)
def matmul(x, packed, factors, out):
    """``out`` ``[T, out]`` = ``x`` ``[T, in]`` (bfloat16 bits) times the transposed weights packed by
    :func:`pack`, rounded to ``out``'s dtype (float32, or bfloat16 bits). Rows go in tiles of
    :data:`TILE_ROWS`; a last tile of at most :data:`SHORT_TILE_ROWS` rows in a short one."""
    steps, groups = x.shape[0], packed.shape[1]
    sums = np.empty((steps, groups), np.float32)
    for t in range(steps):
        for g in range(groups):
            total = np.float32(0.0)
            for j in range(g * GROUP_SIZE, (g + 1) * GROUP_SIZE):
                total += get(x[t], j)
            sums[t, g] = total
    full, rest = steps // TILE_ROWS, steps % TILE_ROWS
    tiles_of_rows = full + (rest > 0)
    for item in prange(packed.shape[0] * tiles_of_rows):
        outputs, rows = np.int64(item // tiles_of_rows), np.int64(item % tiles_of_rows)
        if rows == full and rest <= SHORT_TILE_ROWS:
            _short_tile(packed, factors, x, sums, out, outputs, rows * TILE_ROWS)
        else:
            _tile(packed, factors, x, sums, out, outputs, rows * TILE_ROWS)
