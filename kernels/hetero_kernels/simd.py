"""Sixteen float32 lanes as one Numba value, for kernels whose loops LLVM does not vectorise well.

LLVM vectorises a Numba loop on its own only when the loop is innermost and
worth it. Attention's loops are not shaped so: one head's dot product (64
elements) is too short to pay for the vectorised loop's set-up, and the
value pass wants a head's 64 dimensions held in registers while it walks
the positions. A :data:`float32x16` is an LLVM ``<16 x float>``: a local
variable of that type stays in a register (one 512-bit register with
AVX-512, two 256-bit ones with AVX2), and each function here compiles to a
few instructions.

Memory is read 32 elements at a time, as a pair of vectors
(:func:`load_pair`), widened as the kernels read a cache: a float32 array
as it is, a ``uint16`` array as bfloat16 bits, or as float16 bits when the
table argument is a float32 decode table (see :mod:`hetero_kernels.dtypes`).
A pair holds the 32 elements in one of two orders:

- bfloat16: the even-numbered elements, then the odd-numbered ones. Each
  32-bit word holds two bfloat16 values, widened by a shift and a mask:
  no shuffle, which costs more than the arithmetic on some CPUs (Zen 4);
- otherwise the first sixteen, then the next sixteen.

A dot product does not mind the order as long as both sides share it
(:func:`interleaves` says which one a cache uses); :func:`store_pair`
writes a pair back in the natural order. Nothing is bounds-checked: the
caller keeps ``index + 32`` within the array, which must be contiguous and
1-D. Vectors live in local variables and tuples only: a list or other
container may hold them less aligned than their loads assume.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic, models, overload, register_model

from hetero_kernels import host

LANES = 16
PAIR = 2 * LANES
_F32, _I16, _I32 = ir.FloatType(), ir.IntType(16), ir.IntType(32)
_VECTOR = ir.VectorType(_F32, LANES)


class Float32x16(types.Type):
    def __init__(self) -> None:
        super().__init__(name="float32x16")


float32x16 = Float32x16()
_PAIR_TYPE = types.UniTuple(float32x16, 2)


@register_model(Float32x16)
class _Float32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type) -> None:
        super().__init__(dmm, fe_type, _VECTOR)


def _check(name: str, array: types.Type, dtype: types.Type) -> None:
    if not isinstance(array, types.Array) or array.ndim != 1 or array.layout != "C":
        raise TypingError(f"simd.{name} takes a contiguous 1-D array, got {array}")
    if array.dtype != dtype:
        raise TypingError(f"simd.{name} takes an array of {dtype} here, got {array.dtype}")


def _pointer(context, builder, array_type, array, index, element: ir.Type, count: int = LANES) -> ir.Value:
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), ir.VectorType(element, count).as_pointer())


def _shuffle(builder, first, second, lanes) -> ir.Value:
    return builder.shuffle_vector(first, second, host.constant(_I32, list(lanes)))


def is_bfloat16(array: types.Type, table: types.Type) -> bool:
    """Whether ``array`` (a Numba type) holds bfloat16 bits, with ``table`` as the kernels' decode-table
    argument: a ``uint16`` array does unless a float32 decode table comes with it (float16 bits)."""
    float16 = isinstance(table, types.Array) and table.dtype == types.float32
    return isinstance(array, types.Array) and array.dtype == types.uint16 and not float16


def _load_halves(dtype: types.Type, element: ir.Type, align: int):
    """The pair loader for arrays of ``dtype`` (``element`` in LLVM): 32 elements widened to float32,
    the first sixteen then the next sixteen."""

    @intrinsic
    def load(typingctx, array, index):
        _check("load_pair", array, dtype)

        def codegen(context, builder, signature, args):
            both = builder.load(
                _pointer(context, builder, signature.args[0], args[0], args[1], element, PAIR), align=align
            )
            if element != _F32:  # float16 bits
                both = builder.fpext(
                    builder.bitcast(both, ir.VectorType(ir.HalfType(), PAIR)), ir.VectorType(_F32, PAIR)
                )
            return context.make_tuple(
                builder,
                _PAIR_TYPE,
                [_shuffle(builder, both, both, range(LANES)), _shuffle(builder, both, both, range(LANES, PAIR))],
            )

        return _PAIR_TYPE(array, types.intp), codegen

    return load


_load_pair_float32, _load_pair_float16 = _load_halves(types.float32, _F32, 4), _load_halves(types.uint16, _I16, 2)


@intrinsic
def _load_pair_bfloat16(typingctx, array, index):
    _check("load_pair", array, types.uint16)

    def codegen(context, builder, signature, args):
        words = ir.VectorType(_I32, LANES)
        both = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _I32), align=2)
        even = builder.shl(both, ir.Constant(words, [16] * LANES))  # the low half of each word
        odd = builder.and_(both, ir.Constant(words, [0xFFFF0000] * LANES))
        return context.make_tuple(builder, _PAIR_TYPE, [builder.bitcast(even, _VECTOR), builder.bitcast(odd, _VECTOR)])

    return _PAIR_TYPE(array, types.intp), codegen


def load_pair(array, index, table=None):
    """``array[index:index + 32]`` as two float32 vectors, in the array's pair order (compiled only)."""
    raise NotImplementedError


@overload(load_pair, inline="always")
def _load_pair_overload(array, index, table=None):
    if is_bfloat16(array, table):
        return lambda array, index, table=None: _load_pair_bfloat16(array, index)
    if isinstance(array, types.Array) and array.dtype == types.uint16:
        return lambda array, index, table=None: _load_pair_float16(array, index)
    return lambda array, index, table=None: _load_pair_float32(array, index)


def interleaves(array, table=None):
    """Whether :func:`load_pair` reads ``array`` even elements first (compiled only)."""
    raise NotImplementedError


@overload(interleaves, inline="always")
def _interleaves_overload(array, table=None):
    interleaved = is_bfloat16(array, table)
    return lambda array, table=None: interleaved


def _store_pair(interleaved: bool):
    @intrinsic
    def store(typingctx, array, index, first, second):
        _check("store_pair", array, types.float32)

        def codegen(context, builder, signature, args):
            order = [lane for i in range(LANES) for lane in (i, LANES + i)] if interleaved else range(PAIR)
            address = _pointer(context, builder, signature.args[0], args[0], args[1], _F32, PAIR)
            builder.store(_shuffle(builder, args[2], args[3], order), address, align=4)
            return context.get_dummy_value()

        return types.none(array, types.intp, float32x16, float32x16), codegen

    return store


_store_interleaved, _store_halves = _store_pair(True), _store_pair(False)


def store_pair(array, index, first, second, like, table=None):
    """``array[index:index + 32]`` (float32) = the pair ``first, second`` read from an array like ``like``
    (with ``table``), in the natural order (compiled only)."""
    raise NotImplementedError


@overload(store_pair, inline="always")
def _store_pair_overload(array, index, first, second, like, table=None):
    if is_bfloat16(like, table):
        return lambda array, index, first, second, like, table=None: _store_interleaved(array, index, first, second)
    return lambda array, index, first, second, like, table=None: _store_halves(array, index, first, second)


@intrinsic
def splat(typingctx, value):
    """``value`` in every lane."""

    def codegen(context, builder, signature, args):
        return host.splat(builder, args[0], _VECTOR)

    return float32x16(types.float32), codegen


@intrinsic
def zeros(typingctx):
    def codegen(context, builder, signature, args):
        return ir.Constant(_VECTOR, None)

    return float32x16(), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` lane by lane, rounded once."""

    def codegen(context, builder, signature, args):
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VECTOR, [_VECTOR] * 3), "llvm.fma.v16f32"
        )
        return builder.call(function, args)

    return float32x16(float32x16, float32x16, float32x16), codegen


def _halve(builder, first, second, lanes, width: int) -> ir.Value:
    """``first`` and ``second`` shuffled by ``lanes``, plus shuffled by ``lanes`` each moved ``width`` on."""
    return builder.fadd(
        _shuffle(builder, first, second, lanes), _shuffle(builder, first, second, [lane + width for lane in lanes])
    )


@intrinsic
def total(typingctx, vector):
    """The sum of the lanes, pairwise: lane i plus lane i + 8, then + 4, + 2 and + 1."""

    def codegen(context, builder, signature, args):
        value, width = args[0], LANES
        while width > 1:
            width //= 2
            value = _halve(builder, value, value, range(width), width)
        return builder.extract_element(value, ir.Constant(_I32, 0))

    return types.float32(float32x16), codegen


@intrinsic
def store_totals(typingctx, array, index, a, b, c, d):
    """``array[index:index + 4]`` (float32) = the sums of the lanes of ``a``, ``b``, ``c`` and ``d``,
    each added in :func:`total`'s order, the four sharing their shuffles."""
    _check("store_totals", array, types.float32)

    def codegen(context, builder, signature, args):
        a, b, c, d = args[2:]
        # lanes 0-7 hold a's sums of lanes i and i + 8, lanes 8-15 b's; the same for c and d
        ab = _halve(builder, a, b, [*range(8), *range(16, 24)], 8)
        cd = _halve(builder, c, d, [*range(8), *range(16, 24)], 8)
        # four lanes for each, + 4; then two, + 2; then one, + 1
        abcd = _halve(builder, ab, cd, [*range(4), *range(8, 12), *range(16, 20), *range(24, 28)], 4)
        twos = _halve(builder, abcd, abcd, [0, 1, 4, 5, 8, 9, 12, 13], 2)
        sums = _halve(builder, twos, twos, [0, 2, 4, 6], 1)
        builder.store(sums, _pointer(context, builder, signature.args[0], args[0], args[1], _F32, 4), align=4)
        return context.get_dummy_value()

    return types.none(array, types.intp, float32x16, float32x16, float32x16, float32x16), codegen
