"""Elements of the CUDA kernels' arrays as float32 and back: float16, float32, and bfloat16 as its bits.

Numba has no bfloat16 array type on CUDA, so a bfloat16 array travels as
its raw bits, a 16-bit integer array (``int16`` from a torch view,
``uint16`` from numpy); widening is a shift (exact) and narrowing rounds to
nearest even. On the simulator (``NUMBA_ENABLE_CUDASIM=1``) the Python
functions below run as they are; on a GPU each is replaced by a compiled
overload chosen by the element's or the array's type.
"""

from __future__ import annotations

import numpy as np
from numba import config as numba_config


def widen(element):
    """An element as float32; a 16-bit integer element holds bfloat16 bits (exact)."""
    if isinstance(element, (np.uint16, np.int16)):
        return (np.asarray(element).view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)[()]
    return np.float32(element)


def narrow(array, value):
    """``value`` (float32) as an element of ``array``: bfloat16 bits rounded to nearest even for a 16-bit integer
    array."""
    if array.dtype in (np.uint16, np.int16):
        bits = np.array([value], dtype=np.float32).view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16
        return rounded.astype(np.uint16).view(array.dtype)[0]
    return array.dtype.type(value)


def rounded(array, value):
    """``value`` (float32) rounded to ``array``'s element type, as float32: what storing it there and
    reading it back gives (torch's rounding of each op's result in a 16-bit dtype)."""
    return widen(narrow(array, value))


if not numba_config.ENABLE_CUDASIM:
    from numba import float32, int32, int64, types
    from numba.cuda import libdevice
    from numba.cuda.extending import overload

    @overload(widen, target="cuda")
    def _widen_on_gpu(element):
        if isinstance(element, types.Integer):
            return lambda element: libdevice.int_as_float(int32(element) << 16)
        return lambda element: float32(element)

    @overload(narrow, target="cuda")
    def _narrow_on_gpu(array, value):
        dtype = array.dtype
        if isinstance(dtype, types.Integer):

            def to_bits(array, value):
                bits = int64(libdevice.float_as_int(value)) & 0xFFFFFFFF
                return dtype((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)

            return to_bits
        return lambda array, value: dtype(value)

    @overload(rounded, target="cuda")
    def _rounded_on_gpu(array, value):
        return lambda array, value: widen(narrow(array, value))
