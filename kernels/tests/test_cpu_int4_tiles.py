"""The tiled int4 matmul (bfloat16 dot products) against numpy in float64: its only rounding is float32's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_kernels import cpu_int4_tiles as tiles
from hetero_kernels.dtypes import bfloat16_bits, widen

pytestmark = pytest.mark.skipif(
    not tiles.SUPPORTED,
    reason="this CPU has no AVX-512 BF16, Numba does not compile for it,"
    " or HETERO_KERNELS_PORTABLE forces the portable paths",
)
GROUP, OUTPUTS = tiles.GROUP_SIZE, tiles.OUTPUTS


def weights_of(rng: np.random.Generator, outputs: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random 4-bit weights with float16 scales and minimums, as GGUF's Q4_1 holds them."""
    q = rng.integers(0, 16, (outputs, size)).astype(np.uint8)
    scale = (rng.random((outputs, size // GROUP)) * 0.02).astype(np.float16).astype(np.float32)
    minimum = (-8 * scale + rng.standard_normal(scale.shape) * 0.002).astype(np.float16).astype(np.float32)
    return q, scale, minimum


def exact(x_bits: np.ndarray, q: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The product in float64, and how far float32 sums of ``(128 + q) * x`` may stray from it."""
    outputs, size = q.shape
    weights = (q.reshape(outputs, -1, GROUP) * scale[..., None].astype(np.float64) + minimum[..., None]).reshape(
        outputs, size
    )
    offset_weights = np.repeat(128 * scale + np.abs(minimum), GROUP, axis=1) + np.abs(weights)
    x = widen(x_bits)
    return x @ weights.T, 1e-5 * (np.abs(x) @ offset_weights.T) + 1e-30


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 20),
    tiles_of_outputs=st.integers(1, 5),
    groups=st.integers(1, 5),
    magnitude=st.sampled_from([1e-3, 1.0, 300.0]),
    seed=st.integers(0, 2**16),
)
def test_float32_results_within_float32_rounding(
    tokens: int, tiles_of_outputs: int, groups: int, magnitude: float, seed: int
) -> None:
    """Every row count: whole tiles of rows, a short last tile, a long one padded."""
    rng = np.random.default_rng(seed)
    q, scale, minimum = weights_of(rng, tiles_of_outputs * OUTPUTS, groups * GROUP)
    x = bfloat16_bits((rng.standard_normal((tokens, groups * GROUP)) * magnitude).astype(np.float32))
    x[0, :GROUP] = 0  # an all-zero group
    out = np.empty((tokens, q.shape[0]), np.float32)
    tiles.matmul(x, *tiles.pack(q, scale, minimum), out)
    expected, slack = exact(x, q, scale, minimum)
    assert np.all(np.abs(out - expected) <= slack)


def test_bfloat16_results_are_the_float32_results_rounded() -> None:
    rng = np.random.default_rng(0)
    q, scale, minimum = weights_of(rng, 3 * OUTPUTS, 4 * GROUP)
    x = bfloat16_bits(rng.standard_normal((11, q.shape[1])).astype(np.float32))
    full, rounded = np.empty((11, q.shape[0]), np.float32), np.empty((11, q.shape[0]), np.uint16)
    packed, factors = tiles.pack(q, scale, minimum)
    tiles.matmul(x, packed, factors, full)
    tiles.matmul(x, packed, factors, rounded)
    np.testing.assert_array_equal(rounded, bfloat16_bits(full))


def test_each_weight_lands_where_the_kernel_reads_it() -> None:
    """One weight of 1 among zeros, at every position of a group of sixteen outputs, picks out its input."""
    x = bfloat16_bits(np.arange(1, GROUP + 1, dtype=np.float32)[None])
    scale, minimum = np.ones((OUTPUTS, 1), np.float32), np.zeros((OUTPUTS, 1), np.float32)
    for column in range(GROUP):
        q = np.zeros((OUTPUTS, GROUP), np.uint8)
        q[np.arange(OUTPUTS), (column + np.arange(OUTPUTS)) % GROUP] = 1
        out = np.empty((1, OUTPUTS), np.float32)
        tiles.matmul(x, *tiles.pack(q, scale, minimum), out)
        np.testing.assert_array_equal(out[0], (column + np.arange(OUTPUTS)) % GROUP + 1)


def test_packing_needs_whole_tiles_of_outputs_and_groups() -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        tiles.pack(np.zeros((24, 32), np.uint8), np.ones((24, 1), np.float32), np.zeros((24, 1), np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        tiles.pack(np.zeros((16, 48), np.uint8), np.ones((16, 1), np.float32), np.zeros((16, 1), np.float32))


def test_activations_other_than_bfloat16_bits_are_refused_when_compiled() -> None:
    q, scale, minimum = weights_of(np.random.default_rng(2), OUTPUTS, GROUP)
    with pytest.raises(Exception, match="x must be a contiguous 2-D array of uint16"):
        tiles.matmul(
            np.ones((1, GROUP), np.float32), *tiles.pack(q, scale, minimum), np.empty((1, OUTPUTS), np.float32)
        )
