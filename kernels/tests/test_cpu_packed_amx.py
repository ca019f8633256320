"""The AMX packed matmul against the weights the portable widening gives: bfloat16 activations times those bfloat16
weights, products summed in float32."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import example, given, settings
from packed_problems import PADDED, Spec, Weights, specs

from hetero_kernels import cpu_packed, cpu_packed_amx
from hetero_kernels.dtypes import bfloat16_bits, widen

pytestmark = pytest.mark.skipif(
    not cpu_packed_amx.SUPPORTED,
    reason="this CPU has no AMX-BF16, Numba does not compile for it, Linux refuses the tile state,"
    " or HETERO_KERNELS_PORTABLE forces the portable paths",
)
ROWS_PAST_TILES = attrs.evolve(PADDED, tokens=cpu_packed_amx.ROW_TILES * cpu_packed_amx.TILE_ROWS + 5)
"""Five activation rows past the tiles one pass sums (a second pass, a padded last tile), over a padded last block."""


def widened(weights: Weights) -> np.ndarray:
    """The weights as bfloat16 bits, as the portable widening rounds them."""
    out = np.empty(weights.q.shape, np.uint16)
    cpu_packed.unpack(weights.packed, weights.factors, np.arange(weights.q.shape[0]), out)
    return out


def bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """How far a float32 sum of the exact products (bfloat16 times bfloat16 is exact in float32) may be from
    the exact sum: a rounding per pair of products and per addition, so within ``in + 2`` roundings of the
    products' magnitudes; inputs and results below float32's normal range may be flushed to zero."""
    magnitudes = np.abs(x) @ np.abs(w).T
    return (x.shape[1] + 2) * 2.0**-24 * magnitudes + x.shape[1] * 2.0**-120


@settings(max_examples=30, deadline=None)
@given(spec=specs(max_tokens=40))
@example(spec=ROWS_PAST_TILES)
@example(spec=attrs.evolve(ROWS_PAST_TILES, bits=4, group=32, with_offset=False, factors="float16"))
@example(spec=attrs.evolve(ROWS_PAST_TILES, narrow=True))
def test_results_are_the_widened_weights_product_up_to_float32_summation(spec: Spec) -> None:
    x, weights = spec.build()
    bits = bfloat16_bits(x)
    w = widen(widened(weights)).astype(np.float64)
    exact = widen(bits).astype(np.float64) @ w.T
    out = np.empty((spec.tokens, spec.rows), np.float32)
    cpu_packed_amx.matmul(bits, weights.packed, weights.factors, out)
    assert np.all(np.abs(out - exact) <= bound(widen(bits).astype(np.float64), w))


@settings(max_examples=10, deadline=None)
@given(spec=specs(max_tokens=20))
def test_bfloat16_outputs_are_the_float32_results_rounded(spec: Spec) -> None:
    x, weights = spec.build()
    bits = bfloat16_bits(x)
    exact, rounded = np.empty((spec.tokens, spec.rows), np.float32), np.empty((spec.tokens, spec.rows), np.uint16)
    cpu_packed_amx.matmul(bits, weights.packed, weights.factors, exact)
    cpu_packed_amx.matmul(bits, weights.packed, weights.factors, rounded)
    np.testing.assert_array_equal(rounded, bfloat16_bits(exact))
