"""Attention scores of bfloat16 queries against a bfloat16 cache, sixteen positions at a time, with AVX-512 BF16 dot
products.

In a bfloat16 model the queries reach attention already rounded to
bfloat16 (RoPE rounds them as torch does), so their products with the
cache's bfloat16 keys are exact in float32, and ``vdpbf16ps`` can take
both as they are: no widening, half the instructions of float32
multiply-adds. :mod:`hetero_kernels.cpu` sends such queries here and any
others (float32 activations, other caches) to its float32 scores.

:func:`block` computes the scores of some query rows against one KV head at
sixteen positions. Each position's key is 32-bit words, each a pair of
bfloat16 dimensions; sixteen positions' words are transposed in registers
(64 shuffles per sixteen words), so that each vector holds one pair of
dimensions at all sixteen positions. A dot product with that pair of a
query row, broadcast, then adds to sixteen scores at once, and no
horizontal sums are left: one vector of scores per query row, stored
whole.

:data:`SUPPORTED` says whether this machine can run it (AVX-512 BW and
BF16, with Numba compiling for the host CPU).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetero_kernels import host

SUPPORTED = host.has("avx512bw", "avx512bf16")
POSITIONS = 16  # positions per block: one float32 vector of scores per query row
WORDS = 16  # pairs of dimensions transposed at once
_I32, _I64 = ir.IntType(32), ir.IntType(64)
_FLOATS, _WORDS = host.FLOATS, ir.VectorType(_I32, WORDS)


@njit(cache=True)
def bfloat16_pairs(q):
    """``q`` (float32 ``[rows, head_size]``) as pairs of bfloat16 dimensions, ``[rows, head_size // 2]``
    32-bit words (dimension ``2i`` in the low half of word ``i``, ``2i + 1`` in the high half), if every
    value is a bfloat16 number and the head size a multiple of 32; else an array of no rows."""
    rows, size = q.shape
    if size % (2 * WORDS):
        return np.empty((0, size // 2), np.uint32)
    bits = q.view(np.uint32)
    pairs = np.empty((rows, size // 2), np.uint32)
    rest = np.uint32(0)  # the bits below bfloat16's of every value, or'ed (a loop without exits vectorises)
    for r in range(rows):
        for i in range(size // 2):
            low, high = bits[r, 2 * i], bits[r, 2 * i + 1]
            rest |= (low | high) & np.uint32(0xFFFF)
            pairs[r, i] = (low >> np.uint32(16)) | (high & np.uint32(0xFFFF0000))
    return pairs if rest == 0 else np.empty((0, size // 2), np.uint32)


def _transpose(builder: ir.IRBuilder, vectors: list[ir.Value]) -> list[ir.Value]:
    """Sixteen vectors of sixteen words transposed: word ``j`` of vector ``i`` of the result is word
    ``i`` of ``vectors[j]``. Four rounds of two-input shuffles: words, then word pairs, within each
    128-bit lane; then 128-bit lanes, twice."""

    def shuffle(first, second, lanes):
        return builder.shuffle_vector(first, second, host.constant(_I32, lanes))

    def of_lanes(*lanes):  # whole 128-bit lanes, numbered 0-3 in the first input and 4-7 in the second
        return [4 * lane + i for lane in lanes for i in range(4)]

    low_words = [x for lane in range(4) for x in (4 * lane, 16 + 4 * lane, 4 * lane + 1, 17 + 4 * lane)]
    high_words = [x + 2 for x in low_words]
    low_pairs = [x for lane in range(4) for x in (4 * lane, 4 * lane + 1, 16 + 4 * lane, 17 + 4 * lane)]
    high_pairs = [x + 2 for x in low_pairs]
    words = [shuffle(vectors[j], vectors[j + 1], lanes) for j in range(0, 16, 2) for lanes in (low_words, high_words)]
    # for the four vectors 4g..4g+3: quads[g][k] holds, in 128-bit lane L, word 4L + k of each of them
    quads = [
        [
            shuffle(low, next_low, low_pairs),
            shuffle(low, next_low, high_pairs),
            shuffle(high, next_high, low_pairs),
            shuffle(high, next_high, high_pairs),
        ]
        for low, high, next_low, next_high in (words[4 * g : 4 * g + 4] for g in range(4))
    ]
    result = [None] * WORDS
    for k in range(4):
        front_01, back_01 = (
            shuffle(quads[0][k], quads[1][k], of_lanes(0, 1, 4, 5)),
            shuffle(quads[0][k], quads[1][k], of_lanes(2, 3, 6, 7)),
        )
        front_23, back_23 = (
            shuffle(quads[2][k], quads[3][k], of_lanes(0, 1, 4, 5)),
            shuffle(quads[2][k], quads[3][k], of_lanes(2, 3, 6, 7)),
        )
        result[k], result[4 + k] = (
            shuffle(front_01, front_23, of_lanes(0, 2, 4, 6)),
            shuffle(front_01, front_23, of_lanes(1, 3, 5, 7)),
        )
        result[8 + k], result[12 + k] = (
            shuffle(back_01, back_23, of_lanes(0, 2, 4, 6)),
            shuffle(back_01, back_23, of_lanes(1, 3, 5, 7)),
        )
    return result


def _codegen(context, builder, signature, args):
    scores, q_pairs, keys, rows = (
        context.make_array(t)(context, builder, a) for t, a in zip(signature.args[:4], args[:4], strict=True)
    )
    first, kv_head, first_row, row_count, scale = args[4:]

    def index(n: int) -> ir.Constant:
        return ir.Constant(_I64, n)

    width = cgutils.unpack_tuple(builder, scores.shape)[1]
    pairs = cgutils.unpack_tuple(builder, q_pairs.shape)[1]
    key_words = builder.sdiv(cgutils.unpack_tuple(builder, keys.shape)[1], index(2))
    last = builder.sub(cgutils.unpack_tuple(builder, rows.shape)[0], index(1))
    key_data = builder.bitcast(keys.data, _I32.as_pointer())
    starts = []  # each position's first word of the KV head (positions past the last repeat it)
    for j in range(POSITIONS):
        position = builder.add(first, index(j))
        row = builder.load(
            builder.gep(rows.data, [builder.select(builder.icmp_signed("<", position, last), position, last)])
        )
        starts.append(builder.gep(key_data, [builder.add(builder.mul(row, key_words), builder.mul(kv_head, pairs))]))
    entry = builder.block
    words_loop, rows_loop = builder.append_basic_block("words"), builder.append_basic_block("rows")
    next_words, done = builder.append_basic_block("next_words"), builder.append_basic_block("done")
    builder.branch(words_loop)

    builder.position_at_end(words_loop)
    done_words = builder.phi(_I64)
    done_words.add_incoming(index(0), entry)
    loaded = [
        builder.load(builder.bitcast(builder.gep(start, [done_words]), _WORDS.as_pointer()), align=4)
        for start in starts
    ]
    columns = [builder.bitcast(column, host.BFLOAT16_PAIRS) for column in _transpose(builder, loaded)]
    first_round = builder.icmp_signed("==", done_words, index(0))
    last_round = builder.icmp_signed("==", builder.add(done_words, index(WORDS)), pairs)
    transposed = builder.block
    builder.branch(rows_loop)

    builder.position_at_end(rows_loop)
    r = builder.phi(_I64)
    r.add_incoming(index(0), transposed)
    row = builder.add(first_row, r)
    target = builder.bitcast(
        builder.gep(scores.data, [builder.add(builder.mul(row, width), first)]), _FLOATS.as_pointer()
    )
    zero = ir.Constant(_FLOATS, None)
    sums = [
        builder.select(first_round, zero, builder.load(target, align=4)),
        zero,
        zero,
        zero,
    ]  # four chains of dot products
    query = builder.gep(q_pairs.data, [builder.add(builder.mul(row, pairs), done_words)])
    for i in range(WORDS):
        pair = builder.bitcast(
            host.splat(builder, builder.load(builder.gep(query, [index(i)]), align=4), _WORDS), host.BFLOAT16_PAIRS
        )
        sums[i % 4] = host.dot_bfloat16(builder, sums[i % 4], columns[i], pair)
    total = builder.fadd(builder.fadd(sums[0], sums[1]), builder.fadd(sums[2], sums[3]))
    builder.store(
        builder.select(last_round, builder.fmul(total, host.splat(builder, scale, _FLOATS)), total), target, align=4
    )
    following = builder.add(r, index(1))
    r.add_incoming(following, builder.block)
    builder.cbranch(builder.icmp_signed("<", following, row_count), rows_loop, next_words)

    builder.position_at_end(next_words)
    later_words = builder.add(done_words, index(WORDS))
    done_words.add_incoming(later_words, next_words)
    builder.cbranch(builder.icmp_signed("<", later_words, pairs), words_loop, done)
    builder.position_at_end(done)
    return context.get_dummy_value()


@intrinsic
def block(typingctx, scores, q_pairs, keys, rows, first, kv_head, first_row, row_count, scale):
    """``scores[first_row + r, first:first + 16]`` = ``scale`` times the dot products of query rows
    ``first_row .. first_row + row_count`` (``q_pairs`` from :func:`bfloat16_pairs`) with the keys of
    KV head ``kv_head`` at positions ``first .. first + 15``: position ``p``'s key at row ``rows[p]``
    of ``keys`` (bfloat16 bits ``[rows, kv_heads * head_size]``). Positions past the last of ``rows``
    repeat it; ``scores`` must be wide enough for all sixteen."""
    expected = {
        "scores": (scores, types.float32, 2),
        "q_pairs": (q_pairs, types.uint32, 2),
        "keys": (keys, types.uint16, 2),
        "rows": (rows, types.int64, 1),
    }
    for name, (array, dtype, ndim) in expected.items():
        if not (isinstance(array, types.Array) and array.layout == "C" and array.ndim == ndim and array.dtype == dtype):
            raise TypingError(f"cpu_scores.block: {name} must be a contiguous {ndim}-D array of {dtype}, got {array}")
    return types.void(
        scores, q_pairs, keys, rows, types.int64, types.int64, types.int64, types.int64, types.float32
    ), _codegen
