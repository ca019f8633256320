"""Rows of :mod:`hetero_kernels.cpu_int4`'s packed weights widened back to float32 or bfloat16.

A matmul of many rows (a prefill chunk, a large batch) runs fastest as a
dense bfloat16 matmul (oneDNN, AMX where the CPU has it), and an embedding
lookup needs whole rows. Rather than a dense copy of every weight beside
the packed one, the caller widens the rows it needs, a tile at a time, into
a buffer it reuses:

- :func:`unpack4` reads :func:`cpu_int4.pack <hetero_kernels.cpu_int4.pack>`'s
  layout: for each pair of groups (64 inputs) 32 bytes, byte ``j`` holding
  input ``j`` in its low nibble and input ``32 + j`` in its high nibble,
  ``w = scale * q + minimum`` with each group's factors;
- :func:`unpack8` reads :func:`cpu_int4.pack8 <hetero_kernels.cpu_int4.pack8>`'s:
  one signed byte per input, ``w = scale * (q + 128) + minimum``.

Factors are ``[out, pairs, 4]`` (each pair's two scales, then two minimums)
or, for 8-bit groups of 16, ``[out, pairs, 2, 4]`` (four scales, four
minimums), float32 or float16 bits (``uint16``), widened exactly through a
table.
The arithmetic is one float32 multiply-add per weight, as
:meth:`GroupQuantized.dequantize` computes it; bfloat16 outputs round to
nearest even. Plain Numba: it runs on any CPU, the portable path of every
host.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from hetero_kernels.dtypes import FLOAT16_BITS_TO_FLOAT32
from hetero_kernels.elements import put

GROUP_SIZE = 32
PAIR = 2 * GROUP_SIZE
_OPTIONS = dict(fastmath=True, cache=True)


def _factor(factors, row, pair, k, table):
    """``factors[row, pair, k]`` as float32 (compiled only, see the overload)."""
    raise NotImplementedError


@overload(_factor, inline="always")
def _factor_overload(factors, row, pair, k, table):
    if factors.dtype == types.uint16:

        def from_bits(factors, row, pair, k, table):
            return table[factors[row, pair, k]]

        return from_bits

    def plain(factors, row, pair, k, table):
        return np.float32(factors[row, pair, k])

    return plain


@njit(parallel=True, **_OPTIONS)
def _unpack4(packed, factors, rows, out, table):
    for i in prange(rows.shape[0]):
        row, line = rows[i], out[i]
        for pair in range(factors.shape[1]):
            s0, s1 = _factor(factors, row, pair, 0, table), _factor(factors, row, pair, 1, table)
            m0, m1 = _factor(factors, row, pair, 2, table), _factor(factors, row, pair, 3, table)
            base, first = pair * PAIR, pair * GROUP_SIZE
            for j in range(GROUP_SIZE):  # two passes of contiguous stores, which vectorize
                put(line, base + j, np.float32(packed[row, first + j] & 15) * s0 + m0)
            for j in range(GROUP_SIZE):
                put(line, base + GROUP_SIZE + j, np.float32(packed[row, first + j] >> 4) * s1 + m1)


@njit(parallel=True, **_OPTIONS)
def _unpack8(packed, factors, rows, out, table):
    groups = factors.shape[2] // 2  # in a pair: two of 32 inputs or four of 16
    size = PAIR // groups
    for i in prange(rows.shape[0]):
        row, line = rows[i], out[i]
        for pair in range(factors.shape[1]):
            for group in range(groups):
                scale, minimum = (
                    _factor(factors, row, pair, group, table),
                    _factor(factors, row, pair, groups + group, table),
                )
                base = pair * PAIR + group * size
                for j in range(base, base + size):
                    put(line, j, np.float32(np.int32(packed[row, j]) + 128) * scale + minimum)


def unpack4(packed: np.ndarray, factors: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` = the weights of row ``rows[i]`` (int64 indices) packed by ``cpu_int4.pack``; ``out``
    ``[len(rows), in]`` float32 or bfloat16 bits (``uint16``)."""
    _unpack4(packed, factors, rows, out, FLOAT16_BITS_TO_FLOAT32)


def unpack8(packed: np.ndarray, factors: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """The same for 8-bit weights packed by ``cpu_int4.pack8``."""
    _unpack8(packed, factors.reshape(factors.shape[0], factors.shape[1], -1), rows, out, FLOAT16_BITS_TO_FLOAT32)
