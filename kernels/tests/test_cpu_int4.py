"""The VNNI int4 and int8 matmuls against numpy in float64, within the bound their 16-bit activation steps allow."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_kernels import cpu_int4
from hetero_kernels.dtypes import bfloat16_bits, widen

pytestmark = pytest.mark.skipif(
    not cpu_int4.SUPPORTED,
    reason="this CPU has no AVX-512 VNNI, Numba does not compile for it,"
    " or HETERO_KERNELS_PORTABLE forces the portable paths",
)
GROUP = cpu_int4.GROUP_SIZE


def weights_of(rng: np.random.Generator, rows: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random 4-bit weights with their per-group scales and minimums, as GGUF's Q4_1 holds them."""
    q = rng.integers(0, 16, (rows, size)).astype(np.uint8)
    scale = (rng.random((rows, size // GROUP)) * 0.02).astype(np.float32)
    minimum = (-8 * scale + rng.standard_normal(scale.shape) * 0.002).astype(np.float32)
    return q, scale, minimum


def dense(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> np.ndarray:
    rows, size = q.shape
    grouped = q.reshape(rows, -1, GROUP) * scale[..., None].astype(np.float64) + minimum[..., None]
    return grouped.reshape(rows, size)


def bound(x: np.ndarray, weights: np.ndarray, limit: int = 32767) -> np.ndarray:
    """How far the kernel may be from the exact product: half a 16-bit step per input times its weight,
    plus float32 rounding of the scaled sums."""
    step = np.abs(x).reshape(x.shape[0], -1, GROUP).max(-1) / limit
    quantization = (np.repeat(step, GROUP, axis=1) / 2) @ np.abs(weights).T
    return quantization + 1e-5 * (np.abs(x) @ np.abs(weights).T) + 1e-30


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 5),
    rows=st.integers(1, 40),
    pairs=st.integers(1, 4),
    magnitude=st.sampled_from([1e-3, 1.0, 300.0]),
    float16_factors=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_float32_activations_within_their_quantization_bound(
    tokens: int, rows: int, pairs: int, magnitude: float, float16_factors: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    size = pairs * cpu_int4.PAIR
    q, scale, minimum = weights_of(rng, rows, size)
    if float16_factors:  # as GGUF stores them: packed as float16
        scale, minimum = (v.astype(np.float16).astype(np.float32) for v in (scale, minimum))
    packed, factors = cpu_int4.pack(q, scale, minimum)
    assert factors.dtype == (np.uint16 if float16_factors else np.float32)
    x = (rng.standard_normal((tokens, size)) * magnitude).astype(np.float32)
    x[0, :GROUP] = 0  # an all-zero group
    x[-1, -1] *= 1e4  # a group with one outlier
    out = np.empty((tokens, rows), np.float32)
    cpu_int4.matmul(x, packed, factors, out)
    weights = dense(q, scale, minimum)
    assert np.all(np.abs(out - x.astype(np.float64) @ weights.T) <= bound(x, weights))


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 4),
    rows=st.integers(1, 40),
    pairs=st.integers(1, 4),
    magnitude=st.sampled_from([1e-3, 1.0, 300.0]),
    group=st.sampled_from([GROUP, cpu_int4.FINE_GROUP_SIZE]),
    with_offset=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_8_bit_weights_within_the_same_bound(
    tokens: int, rows: int, pairs: int, magnitude: float, group: int, with_offset: bool, seed: int
) -> None:
    """GGUF's Q8_0 (``scale * q``, ``q`` in -128..127, float16 scales) in one call, the activations'
    largest magnitude at 32639 (their low byte is signed here); and with an offset per group, in
    groups of 32 (Q5_1's) or 16 (Q6_K's and Q2_K's)."""
    rng = np.random.default_rng(seed)
    size = pairs * cpu_int4.PAIR
    q = rng.integers(-128, 128, (rows, size)).astype(np.int8)
    q[0, :GROUP] = -128  # the extremes
    q[-1, -GROUP:] = 127
    scale = (rng.random((rows, size // group)) * 0.02).astype(np.float16).astype(np.float32)
    offset = (rng.standard_normal(scale.shape) * 0.01).astype(np.float32) if with_offset else np.zeros_like(scale)
    weights, factors = cpu_int4.pack8(q, scale, offset if with_offset else None)
    assert factors.dtype == (np.float32 if with_offset else np.uint16)  # -128 * a float16 scale is a float16 too
    assert factors.shape == ((rows, pairs, 4) if group == GROUP else (rows, pairs, 2, 4))
    x = (rng.standard_normal((tokens, size)) * magnitude).astype(np.float32)
    x[0, :GROUP] = 0
    x[-1, -1] *= 1e4
    out = np.empty((tokens, rows), np.float32)
    cpu_int4.matmul8(x, weights, factors, out)
    dense_weights = (q.reshape(rows, -1, group) * scale[..., None].astype(np.float64) + offset[..., None]).reshape(
        rows, size
    )
    assert np.all(np.abs(out - x.astype(np.float64) @ dense_weights.T) <= bound(x, dense_weights, 32639))


def test_bfloat16_activations_compute_as_their_float32_values_and_round_the_result() -> None:
    rng = np.random.default_rng(0)
    q, scale, minimum = weights_of(rng, 50, 3 * cpu_int4.PAIR)
    bits = bfloat16_bits(rng.standard_normal((3, q.shape[1])).astype(np.float32))
    exact, rounded = np.empty((3, 50), np.float32), np.empty((3, 50), np.uint16)
    cpu_int4.matmul(widen(bits).astype(np.float32), *cpu_int4.pack(q, scale, minimum), exact)
    cpu_int4.matmul(bits, *cpu_int4.pack(q, scale, minimum), rounded)
    np.testing.assert_array_equal(rounded, bfloat16_bits(exact))


def test_groups_far_below_float32_rounding_count_as_zero_without_overflowing() -> None:
    rng = np.random.default_rng(1)
    q, scale, minimum = weights_of(rng, 8, cpu_int4.PAIR)
    x = np.full((1, cpu_int4.PAIR), 1e-36, np.float32)
    x[0, GROUP:] = 1.0
    out = np.empty((1, 8), np.float32)
    cpu_int4.matmul(x, *cpu_int4.pack(q, scale, minimum), out)
    weights = dense(q, scale, minimum)
    assert np.all(np.isfinite(out))
    assert np.all(np.abs(out - x.astype(np.float64) @ weights.T) <= bound(x, weights))


def test_packing_needs_whole_pairs_of_groups() -> None:
    with pytest.raises(ValueError, match="multiple of 64"):
        cpu_int4.pack(np.zeros((2, 96), np.uint8), np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="multiple of 64"):
        cpu_int4.pack8(np.zeros((2, 96), np.int8), np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="groups must be 32 or 16 inputs"):
        cpu_int4.pack8(np.zeros((2, 64), np.int8), np.ones((2, 8), np.float32))


def test_factors_are_packed_as_float16_exactly_when_every_one_fits() -> None:
    """Every finite float16 value (normal, subnormal, signed zero) packs as its own bits; one value
    float16 cannot hold keeps the whole layer in float32."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    bits = bits[np.isfinite(bits.view(np.float16))][: (1 << 16) - 2048]  # 63,488 values: 15,872 rows of 4
    values = bits.view(np.float16).astype(np.float32).reshape(-1, 2, 2)
    scale, minimum = values[:, 0], values[:, 1]
    q = np.zeros((scale.shape[0], cpu_int4.PAIR), np.uint8)
    _, factors = cpu_int4.pack(q, scale, minimum)
    np.testing.assert_array_equal(factors.reshape(-1), bits)
    scale[5, 1] = np.float32(0.1)  # not a float16
    _, factors = cpu_int4.pack(q, scale, minimum)
    assert factors.dtype == np.float32
    np.testing.assert_array_equal(factors, np.concatenate([scale.reshape(-1, 1, 2), minimum.reshape(-1, 1, 2)], axis=2))
