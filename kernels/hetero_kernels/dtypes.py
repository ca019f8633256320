"""Decode tables for 16-bit caches that Numba cannot do arithmetic on directly.

Indexing a table by an element's raw bits gives its exact float32 value.
"""

from __future__ import annotations

import numpy as np

FLOAT16_BITS_TO_FLOAT32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
"""float16 bit pattern -> float32 value."""

NO_DECODE_TABLE = np.zeros(0, dtype=np.float32)
"""Passed where the cache is already float32/float64 (one compiled signature for the table argument)."""
