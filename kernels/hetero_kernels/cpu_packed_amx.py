""":mod:`hetero_kernels.cpu_packed`'s weights times bfloat16 activations on AMX: each block widened once into bfloat16
tiles, then one tile product per 16 activation rows and 32 inputs.

A step of many rows (a prompt's chunk, a batch of decodes) multiplies every
weight by every row. The VNNI kernel pays a dot product per four inputs and
row; widening the weights for a dense matmul pays a pass over memory. Here
each block of sixteen output rows is widened, in the cache, into the form
AMX multiplies (``scale * q + minimum`` in float32, rounded to bfloat16,
as :func:`~hetero_kernels.cpu_packed.unpack` widens it)::

    staged [in / 2, 64] bytes        row j: inputs 2j and 2j + 1 of the block's sixteen rows,
                                     as sixteen bfloat16 pairs (output row r: bytes 4r .. 4r + 3)

and ``tdpbf16ps`` multiplies 32 inputs of 16 activation rows (bfloat16,
straight from the activations) by 16 of those rows at a time, summing
float32 in tile registers across the whole input. Up to
:data:`ROW_TILES` tiles of activation rows share each loaded weight tile.
The results are the widened weights' dense product, as
:func:`~hetero_kernels.cpu_packed.unpack_columns` and a bfloat16 matmul
compute it, with products summed in float32 in another order.

:data:`SUPPORTED` says whether this machine can run it (AMX-BF16 and
AVX-512 BF16, Numba compiling for the host CPU, and Linux granting the
process the tile state).
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from hetero_kernels import host
from hetero_kernels.cpu_packed import BIASES, ROWS, factor_vectors, form_of, forms_of, group_vectors
from hetero_kernels.elements import put

TILE_ROWS = 16  # activation rows a tile holds
TILE_INPUTS = 32  # inputs a tile product sums (64 bytes of bfloat16)
SHARES = 64  # runs of blocks the threads share out: each stages its blocks in one buffer
ROW_TILES = 4  # tiles of activation rows sharing a loaded weight tile (each sums in its own tile register)
_OPTIONS = dict(fastmath=True, cache=True)

_ARCH_PRCTL, _REQ_XCOMP_PERM, _XTILEDATA = 158, 0x1023, 18  # x86-64 Linux: ask for the AMX tile data state


def _tiles_granted() -> bool:
    """Whether Linux lets this process use AMX tiles (asked once for the process: every thread may then)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_ARCH_PRCTL, _REQ_XCOMP_PERM, _XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


SUPPORTED = host.has("amx-bf16", "amx-tile", "avx512bf16", "avx512bw") and _tiles_granted()

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_TO_BFLOAT16 = "llvm.x86.avx512bf16.cvtne2ps2bf16.512"  # two FLOATS (second, first) as BFLOAT16_PAIRS, rounded to even
_POINTER = _I8.as_pointer()
_ACTIVATIONS, _WEIGHTS = 0, 1  # tile registers; the sums' are 2 .. 2 + ROW_TILES - 1


def _configuration() -> ir.Constant:
    """The 64 bytes ``ldtilecfg`` reads: palette 1, every tile used sixteen rows of 64 bytes."""
    config = bytearray(64)
    config[0] = 1
    for tile in range(2 + ROW_TILES):
        config[16 + 2 * tile : 18 + 2 * tile] = (64).to_bytes(2, "little")
        config[48 + tile] = 16
    return ir.Constant(ir.VectorType(_I8, 64), list(config))


def _make_stage(vectors: int):
    """An intrinsic that widens group ``g`` of one block (its ``vectors`` stored vectors) into ``staged`` (the
    block's ``[in / 2, 64]`` bytes, as the module docstring draws them)."""

    def codegen(context, builder, signature, args):
        weights, factors, staged = (
            context.make_array(t)(context, builder, a) for t, a in zip(signature.args[:3], args[:3], strict=True)
        )
        g = args[3]
        unsigned = signature.args[0].dtype == types.uint8
        bits, runs = form_of(unsigned, vectors)
        group = runs * 4
        floats, words = host.FLOATS, ir.VectorType(_I32, ROWS)
        halves = host.declare(builder.module, _TO_BFLOAT16, host.BFLOAT16_PAIRS, [floats, floats])
        scale, minimum = factor_vectors(builder, factors, signature.args[1].dtype, g, group, BIASES[bits])
        # quarter q of a vector holds rows 4q .. 4q + 3, four inputs each: each row's factor over its four
        spread = [host.constant(_I32, [4 * q + lane // 4 for lane in range(16)]) for q in range(4)]
        scales = [builder.shuffle_vector(scale, scale, mask) for mask in spread]
        minimums = [builder.shuffle_vector(minimum, minimum, mask) for mask in spread]
        first_row = builder.mul(g, ir.Constant(_I64, group // 2))
        for k, values in enumerate(group_vectors(builder, weights, g, vectors, unsigned)):
            quarters = []
            for q in range(4):
                quarter = builder.shuffle_vector(values, values, host.constant(_I32, list(range(16 * q, 16 * q + 16))))
                wide = builder.uitofp(quarter, floats)
                product = builder.fmul(wide, scales[q], flags=["contract"])
                quarters.append(builder.fadd(product, minimums[q], flags=["contract"]))
            # rows 0..7 then 8..15 as bfloat16, word 2r + h: row r's inputs 2h and 2h + 1 (of the vector's four)
            low, high = (
                builder.bitcast(builder.call(halves, [quarters[2 * p + 1], quarters[2 * p]]), words) for p in range(2)
            )
            for h in range(2):  # inputs 4k + 2h and 4k + 2h + 1 of the group: one staged row
                pick = [2 * r + h for r in range(ROWS // 2)] + [ROWS + 2 * r + h for r in range(ROWS // 2)]
                row = builder.shuffle_vector(low, high, host.constant(_I32, pick))
                line = builder.add(first_row, ir.Constant(_I64, 2 * k + h))
                at = host.address(builder, staged, builder.mul(line, ir.Constant(_I64, 64)), row.type)
                builder.store(row, at, align=1)
        return context.get_dummy_value()

    def stage(typingctx, weights, factors, staged, g):
        return types.void(weights, factors, staged, g), codegen

    return intrinsic(stage)


_STAGES = {stored: _make_stage(stored) for stored in (3, 4, 6, 8)}


def _stage(block, factors, staged, g):
    """:func:`_make_stage`'s intrinsic for ``block``'s form (compiled only, see the overload)."""
    raise NotImplementedError


@overload(_stage, inline="always")
def _stage_overload(block, factors, staged, g):
    first, second, third = forms_of(block)
    one, two, three = _STAGES[first], _STAGES[second], _STAGES[third]

    def stage(block, factors, staged, g):
        stored = block.shape[1]
        if stored == first:
            one(block, factors, staged, g)
        elif stored == second:
            two(block, factors, staged, g)
        else:
            three(block, factors, staged, g)

    return stage


@intrinsic
def _configure(typingctx):
    """Load the tile configuration (:func:`_configuration`) on this thread: each of a call's runs of blocks
    does, since the threads a run lands on are Numba's to pick."""

    def codegen(context, builder, signature, args):
        config = cgutils.alloca_once(builder, ir.VectorType(_I8, 64))
        builder.store(_configuration(), config, align=64)
        declared = host.declare(builder.module, "llvm.x86.ldtilecfg", ir.VoidType(), [_POINTER])
        builder.call(declared, [builder.bitcast(config, _POINTER)])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _release(typingctx):
    """Return this thread's tiles to their initial state (nothing of them left to save at a context switch)."""

    def codegen(context, builder, signature, args):
        builder.call(host.declare(builder.module, "llvm.x86.tilerelease", ir.VoidType(), []), [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _products(typingctx, staged, x, sums, first, count):
    """``sums`` ``[16 * count, 16]`` float32 = activation rows ``first ..`` of ``x`` (bfloat16 bits ``[T, in]``,
    ``T`` a multiple of 16 past ``first + 16 * count``) times the staged block, ``count`` (1 ..
    :data:`ROW_TILES`) tiles of rows summed at once."""

    def codegen(context, builder, signature, args):
        staged, x, sums = (
            context.make_array(t)(context, builder, a) for t, a in zip(signature.args[:3], args[:3], strict=True)
        )
        first, count = args[3], args[4]
        module = builder.module

        def tile_call(name, arguments, kinds):
            return builder.call(host.declare(module, name, ir.VoidType(), kinds), arguments)

        def number(tile):
            return ir.Constant(_I8, tile)

        def constant(value):
            return ir.Constant(_I64, value)

        size = cgutils.unpack_tuple(builder, x.shape)[1]
        steps = builder.udiv(size, constant(TILE_INPUTS))
        row_bytes = builder.mul(size, constant(2))
        load_kinds = [_I8, _POINTER, _I64]

        def tiles_used(body):  # body(i) for each tile of rows i < count
            for i in range(ROW_TILES):
                used = builder.icmp_signed(">", count, constant(i))
                with builder.if_then(used):
                    body(i)

        tiles_used(lambda i: tile_call("llvm.x86.tilezero", [number(2 + i)], [_I8]))

        with cgutils.for_range(builder, steps) as loop:
            s = loop.index
            weights_at = host.address(builder, staged, builder.mul(s, constant(TILE_INPUTS // 2 * 64)), _I8)
            tile_call("llvm.x86.tileloadd64", [number(_WEIGHTS), weights_at, constant(64)], load_kinds)

            def multiply(i):
                row = builder.add(first, constant(TILE_ROWS * i))
                start = builder.add(builder.mul(row, size), builder.mul(s, constant(TILE_INPUTS)))
                at = host.address(builder, x, start, _I8)
                tile_call("llvm.x86.tileloadd64", [number(_ACTIVATIONS), at, row_bytes], load_kinds)
                tile_call("llvm.x86.tdpbf16ps", [number(2 + i), number(_ACTIVATIONS), number(_WEIGHTS)], [_I8] * 3)

            tiles_used(multiply)

        def store(i):
            at = host.address(builder, sums, constant(TILE_ROWS * ROWS * i), _I8)
            tile_call("llvm.x86.tilestored64", [number(2 + i), at, constant(4 * ROWS)], load_kinds)

        tiles_used(store)
        return context.get_dummy_value()

    return types.void(staged, x, sums, first, count), codegen


@njit(**_OPTIONS)
def _padded(x):
    """``x`` with zero rows up to a multiple of :data:`TILE_ROWS`."""
    tokens = x.shape[0]
    rows = -(-tokens // TILE_ROWS) * TILE_ROWS
    if rows == tokens:
        return x
    wide = np.zeros((rows, x.shape[1]), np.uint16)
    wide[:tokens] = x
    return wide


@njit(parallel=True, **_OPTIONS)
def matmul(x, weights, factors, out):
    """``out`` ``[T, out]`` = ``x`` ``[T, in]`` (bfloat16 bits) times the transposed weights packed by
    :func:`~hetero_kernels.cpu_packed.pack4` or :func:`~hetero_kernels.cpu_packed.pack8`, widened to
    bfloat16, products summed in float32, rounded to ``out``'s dtype (float32 or bfloat16 bits). Blocks of
    sixteen output rows are shared out among the threads."""
    tokens, size = x.shape
    rows = _padded(x)
    columns = out.shape[1]
    blocks = weights.shape[0]
    shares = min(blocks, SHARES)
    for share in prange(shares):
        _configure()
        staged = np.empty((size // 2, 64), np.uint8)
        sums = np.empty((ROW_TILES * TILE_ROWS, ROWS), np.float32)
        for b in range(share * blocks // shares, (share + 1) * blocks // shares):
            block, block_factors = weights[b], factors[b]
            for g in range(weights.shape[1]):
                _stage(block, block_factors, staged, g)
            width = min(ROWS, columns - b * ROWS)
            for t in range(0, rows.shape[0], ROW_TILES * TILE_ROWS):
                count = min(ROW_TILES, (rows.shape[0] - t) // TILE_ROWS)
                _products(staged, rows, sums, t, count)
                for r in range(min(count * TILE_ROWS, tokens - t)):
                    for c in range(width):
                        put(out[t + r], b * ROWS + c, sums[r, c])
        _release()
