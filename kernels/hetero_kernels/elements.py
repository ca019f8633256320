"""Elements of the kernels' arrays read and written as float32, whatever their dtype.

Activations and caches are float32, float16 or bfloat16; numpy has no
bfloat16, so a bfloat16 array travels as its raw bits (``uint16``, see
:mod:`hetero_kernels.dtypes`). Each accessor here is compiled for the
array's dtype (an ``overload``), so one kernel source serves every dtype:

- :func:`load` reads an element as float32, through a decode table for
  float16 bits or a shift for bfloat16 bits (the table argument's dtype
  says which);
- :func:`get` / :func:`put` read and write activations (float32 or bfloat16
  bits), rounding to nearest even on the way into bfloat16;
- :func:`rounded` rounds a float32 as storing it in an array would.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from hetero_kernels.dtypes import WIDEN_BFLOAT16

_OPTIONS = dict(fastmath=True, cache=True)


@intrinsic
def bfloat16_to_float32(typingctx, bits):
    """The float32 whose top 16 bits are ``bits`` (a uint16): exactly the bfloat16 value."""

    def codegen(context, builder, signature, args):
        wide = builder.zext(args[0], ir.IntType(32))
        return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def float32_to_bfloat16(typingctx, value):
    """The bfloat16 nearest ``value`` (ties to even), as its uint16 bits."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        odd = builder.and_(builder.lshr(bits, ir.Constant(i32, 16)), ir.Constant(i32, 1))
        rounded = builder.add(builder.add(bits, ir.Constant(i32, 0x7FFF)), odd)
        return builder.trunc(builder.lshr(rounded, ir.Constant(i32, 16)), ir.IntType(16))

    return types.uint16(types.float32), codegen


def load(row, d, table):
    """``row[d]`` as a float32 (compiled only, see the overload)."""
    raise NotImplementedError


@overload(load, inline="always")
def _load_overload(row, d, table):
    if row.dtype != types.uint16:
        return lambda row, d, table: np.float32(row[d])
    if table.dtype == types.uint16:  # the WIDEN_BFLOAT16 marker
        return lambda row, d, table: bfloat16_to_float32(row[d])
    return lambda row, d, table: table[row[d]]  # float16 bits through the decode table


@njit(inline="always", **_OPTIONS)
def get(array, i):
    """``array[i]`` as a float32: activations are float32 or bfloat16 bits, read as the cache is."""
    return load(array, i, WIDEN_BFLOAT16)


def put(array, i, value):
    """``array[i] = value``, rounded to the array's dtype (compiled only, see the overload)."""
    raise NotImplementedError


@overload(put, inline="always")
def _put_overload(array, i, value):
    if array.dtype == types.uint16:

        def put_bits(array, i, value):
            array[i] = float32_to_bfloat16(value)

        return put_bits

    def put(array, i, value):
        array[i] = value

    return put


def rounded(value, like):
    """``value`` rounded to the dtype of the array ``like`` (compiled only, see the overload)."""
    raise NotImplementedError


@overload(rounded, inline="always")
def _rounded_overload(value, like):
    if like.dtype == types.uint16:
        return lambda value, like: bfloat16_to_float32(float32_to_bfloat16(value))
    return lambda value, like: value
