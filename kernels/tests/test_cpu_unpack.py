"""Widening cpu_int4's packed weights back to rows gives each weight's float32 value, on any CPU.

One multiply-add per weight, which the compiler may fuse (one rounding instead of two): within a
float32 rounding of its terms of numpy's two-step value."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_kernels import cpu_int4, cpu_unpack
from hetero_kernels.dtypes import bfloat16_bits

GROUP = cpu_unpack.GROUP_SIZE


def grouped(values: np.ndarray) -> np.ndarray:
    return np.repeat(values, GROUP, axis=1)


def assert_one_rounding_apart(actual: np.ndarray, product: np.ndarray, addend: np.ndarray) -> None:
    expected = product + addend
    slack = 2.0**-23 * (np.abs(product) + np.abs(addend))
    assert bool((np.abs(actual.astype(np.float64) - expected) <= slack).all())


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), pairs=st.integers(1, 4), exact_halves=st.booleans(), seed=st.integers(0, 2**16))
def test_4_bit_rows_widen_to_each_weights_value(rows: int, pairs: int, exact_halves: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = pairs * 2 * GROUP
    q = rng.integers(0, 16, (rows, size)).astype(np.uint8)
    scale = (rng.random((rows, size // GROUP)) * 0.02).astype(np.float32)
    minimum = (-8 * scale + rng.standard_normal(scale.shape) * 0.002).astype(np.float32)
    if exact_halves:  # factors float16 holds exactly, as GGUF stores them: packed as float16 bits
        scale, minimum = scale.astype(np.float16).astype(np.float32), minimum.astype(np.float16).astype(np.float32)
    packed, factors = cpu_int4.pack(q, scale, minimum)
    assert (factors.dtype == np.uint16) == exact_halves
    product, addend = q.astype(np.float32) * grouped(scale), grouped(minimum)
    picked = rng.permutation(rows)[: max(1, rows // 2)].astype(np.int64)
    out = np.empty((picked.size, size), np.float32)
    cpu_unpack.unpack4(packed, factors, picked, out)
    assert_one_rounding_apart(out, product[picked], addend[picked])
    bits = np.empty((picked.size, size), np.uint16)
    cpu_unpack.unpack4(packed, factors, picked, bits)
    np.testing.assert_array_equal(bits, bfloat16_bits(out))


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 9),
    pairs=st.integers(1, 4),
    with_offset=st.booleans(),
    fine=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_8_bit_rows_widen_to_each_weights_value(
    rows: int, pairs: int, with_offset: bool, fine: bool, seed: int
) -> None:
    """In groups of 32, or of 16 (``pack8``'s finer factors)."""
    rng = np.random.default_rng(seed)
    size, group = pairs * 2 * GROUP, GROUP // 2 if fine else GROUP
    q = rng.integers(-128, 128, (rows, size)).astype(np.int8)
    scale = (rng.random((rows, size // group)) * 0.02).astype(np.float16).astype(np.float32)
    offset = (rng.standard_normal(scale.shape) * 0.01).astype(np.float32) if with_offset else None
    packed, factors = cpu_int4.pack8(q, scale, offset)

    def grouped_by(values):  # per input
        return np.repeat(values, group, axis=1)

    minimum = grouped_by(np.float32(-128.0) * scale + (0 if offset is None else offset))
    product = (q.astype(np.float32) + 128) * grouped_by(scale)  # the packed form's own arithmetic
    reference = q.astype(np.float64) * grouped_by(scale) + (0 if offset is None else grouped_by(offset))
    out = np.empty((rows, size), np.float32)
    cpu_unpack.unpack8(packed, factors, np.arange(rows, dtype=np.int64), out)
    assert_one_rounding_apart(out, product, minimum)
    np.testing.assert_allclose(out, reference, rtol=1e-6, atol=1e-6 * float(np.abs(reference).max()))


@pytest.mark.parametrize("unpack", [cpu_unpack.unpack4, cpu_unpack.unpack8], ids=["4-bit", "8-bit"])
def test_no_rows_asked_writes_nothing(unpack) -> None:
    packed, factors = cpu_int4.pack8(np.zeros((2, 64), np.int8), np.ones((2, 2), np.float32))
    out = np.empty((0, 64), np.float32)
    unpack(
        packed if unpack is cpu_unpack.unpack8 else packed[:, :32].view(np.uint8).copy(),
        factors,
        np.zeros(0, np.int64),
        out,
    )
