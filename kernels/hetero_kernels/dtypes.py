"""16-bit caches, which numpy (bfloat16) or Numba (float16) cannot do arithmetic on directly.

numpy has no bfloat16: a bfloat16 cache travels as its raw bits, a
``uint16`` array, in every module of this package. The markers below are
passed as the Numba kernels' ``decode_table`` argument; its dtype picks the
widening when the kernel is compiled.
"""

from __future__ import annotations

import numpy as np

FLOAT16_BITS_TO_FLOAT32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
"""float16 bit pattern -> float32 value: indexing it by an element's raw bits gives its exact value."""

WIDEN_BFLOAT16 = np.zeros(0, dtype=np.uint16)
"""Marks a ``uint16`` cache as bfloat16 bits, widened by a shift (exact)."""

NO_DECODE_TABLE = np.zeros(0, dtype=np.float32)
"""Passed where the cache is already float32/float64 (one compiled signature for the table argument)."""


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to bfloat16 (to nearest, ties to even), as raw bits."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def widen(values: np.ndarray) -> np.ndarray:
    """Cache values as float64; a ``uint16`` array holds bfloat16 bits."""
    if values.dtype == np.uint16:
        return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return values.astype(np.float64)
