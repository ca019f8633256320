"""The packed-weight layout on any CPU: the portable matmul against numpy in float64 within the bound its 16-bit
activation steps allow, widening rows back to each weight's value, and what packing refuses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packed_problems import FORMS, GROUP, Weights, activations, specs, term_magnitudes, weights_of, with_two_signatures

from hetero_kernels import cpu_packed
from hetero_kernels.dtypes import bfloat16_bits, widen


def bound(x: np.ndarray, weights: Weights) -> np.ndarray:
    """How far the matmul may be from the exact product: per input, half its group's 16-bit step (the group's
    largest magnitude / 32639) plus the step's and inverse step's own rounding (under 2**-7 of a step at
    |v| <= 32639), times |weight|; a group too small for a finite inverse step is dropped whole. Then float32
    rounding: each group's two terms take up to four roundings (the integer sum's conversion, step times
    scale, the product; an 8-bit minimum one when packed), their sum one per term, so within (2 * groups + 6)
    roundings of the terms' magnitudes."""
    tokens, size = x.shape
    magnitude = np.abs(x.astype(np.float64))
    largest = magnitude.reshape(tokens, -1, GROUP).max(-1)
    dropped = np.repeat(largest < cpu_packed.SMALLEST_STEP * cpu_packed.LIMIT, GROUP, axis=1)
    step = np.repeat(largest / cpu_packed.LIMIT, GROUP, axis=1)
    missed = np.where(dropped, magnitude, (0.5 + 2.0**-7) * step)
    roundings = (2 * size // weights.group + 6) * 2.0**-24 * term_magnitudes(x, weights)
    return missed @ np.abs(weights.exact).T + roundings


def factor_dtype(spec, weights: Weights) -> type:
    """Coded factors as bytes; else float16 bits where float16 holds every scale and minimum exactly."""
    if spec.factors == "coded":
        return np.int8
    halves = all(np.array_equal(v.astype(np.float16).astype(np.float32), v) for v in (weights.scale, weights.minimum))
    return np.uint16 if halves else np.float32


@settings(max_examples=40, deadline=None)
@given(spec=specs(max_tokens=9))
def test_matmul_within_half_a_16_bit_step_per_input_and_float32_rounding(spec) -> None:
    x, weights = spec.build()
    assert weights.factors.dtype == factor_dtype(spec, weights)
    assert weights.packed.dtype == (np.uint8 if spec.bits == 4 or spec.narrow else np.int8)  # 6 bits where they fit
    out = np.empty((spec.tokens, spec.rows), np.float32)
    cpu_packed.matmul(x, weights.packed, weights.factors, out)
    assert np.all(np.abs(out - x.astype(np.float64) @ weights.exact.T) <= bound(x, weights))


@settings(max_examples=20, deadline=None)
@given(spec=specs(max_tokens=9))
def test_bfloat16_activations_and_outputs_are_the_float32_results_rounded(spec) -> None:
    """bfloat16 activations widen exactly to float32, so their steps and integer sums are the float32 path's,
    and the output is the same float32 total rounded to nearest even: equal bit for bit."""
    x, weights = with_two_signatures(spec).build()
    bits = bfloat16_bits(x)
    exact, rounded = np.empty((spec.tokens, spec.rows), np.float32), np.empty((spec.tokens, spec.rows), np.uint16)
    cpu_packed.matmul(widen(bits).astype(np.float32), weights.packed, weights.factors, exact)
    cpu_packed.matmul(bits, weights.packed, weights.factors, rounded)
    np.testing.assert_array_equal(rounded, bfloat16_bits(exact))


@pytest.mark.parametrize(("bits", "group"), FORMS)
def test_groups_too_small_for_a_finite_inverse_step_count_as_zero(bits: int, group: int) -> None:
    rng = np.random.default_rng(1)
    weights = weights_of(rng, 20, 3 * GROUP, bits, group, with_offset=bits == 8, factors="float32")
    x = activations(rng, 3, 3 * GROUP, 1.0)
    x[0, :GROUP] = 1e-36  # dropped: its inverse step would overflow
    x[1, GROUP : 2 * GROUP] = 4e-26  # just above the smallest step: inverse 8e29
    x[2] = 1e-36
    out = np.empty((3, 20), np.float32)
    cpu_packed.matmul(x, weights.packed, weights.factors, out)
    assert np.all(np.isfinite(out))
    assert np.all(np.abs(out - x.astype(np.float64) @ weights.exact.T) <= bound(x, weights))


@pytest.mark.parametrize("group", [GROUP, cpu_packed.FINE_GROUP_SIZE])
@pytest.mark.parametrize("bfloat16", [False, True])
def test_rows_quantized_on_the_threads_are_each_rows_own_and_give_it_back(group: int, bfloat16: bool) -> None:
    """A step of ``PARALLEL_QUANTIZE_FROM`` activation values or more quantizes its rows on the threads: each
    row's bytes and factors are those it gets alone, ``step * v`` is the row within half a step and the step's
    own rounding, and the second factor is the step times the group's sum of ``v``."""
    rng = np.random.default_rng(2)
    size = 18 * GROUP
    tokens = -(-cpu_packed.PARALLEL_QUANTIZE_FROM // size) + 3
    x = activations(rng, tokens, size, 1.0)
    x = bfloat16_bits(x) if bfloat16 else x
    quantized = cpu_packed.quantize_rows(x, group)
    for t in range(tokens):
        for rows, alone in zip(quantized, cpu_packed.quantize_rows(x[t : t + 1], group), strict=True):
            np.testing.assert_array_equal(rows[t], alone[0])
    high, low, factors = quantized
    values = high.astype(np.int64) * 256 + low
    assert np.all(np.abs(values) <= cpu_packed.LIMIT)
    steps = np.repeat(factors[:, :, 0].astype(np.float64), group, axis=1)
    assert np.all(np.abs(widen(x) - steps * values) <= (0.5 + 2.0**-7) * steps)
    sums = values.reshape(tokens, -1, group).sum(-1)
    np.testing.assert_allclose(factors[:, :, 1], factors[:, :, 0].astype(np.float64) * sums, rtol=2.0**-23)


def rounded_once(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a * b + c`` with one rounding (a fused multiply-add) for float32 ``b`` and ``c`` and small integers
    ``a``: the product is exact in float64; the sum is rounded to odd there (its last bit set where inexact),
    and a float64 rounded to odd rounds to float32 as the exact sum would (53 bits >= 24 + 2)."""
    product = a.astype(np.float64) * b
    total = product + c
    back = total - product
    error = (product - (total - back)) + (c - back)  # TwoSum: total + error is the exact sum
    even = (total.view(np.int64) & 1) == 0
    toward = np.where(error > 0, np.inf, -np.inf)
    return np.where((error != 0) & even, np.nextafter(total, toward), total).astype(np.float32)


@settings(max_examples=30, deadline=None)
@given(spec=specs(max_tokens=1))
def test_unpack_widens_chosen_rows_to_each_weights_value(spec) -> None:
    """Rows in any order, repeated, and the last one, which the padded block holds where the row count is not a
    multiple of 16. Each weight is the packed form's ``scale * q + minimum`` (8-bit: ``scale * (q + 128) +
    minimum``), one float32 multiply-add, which the compiler may fuse: rounded once or twice, nothing else.
    bfloat16 rows are those values rounded to nearest even."""
    _, weights = spec.build()
    rows = np.append(np.random.default_rng(spec.seed).integers(0, spec.rows, 6), spec.rows - 1)
    out, bits = np.empty((rows.size, spec.size), np.float32), np.empty((rows.size, spec.size), np.uint16)
    cpu_packed.unpack(weights.packed, weights.factors, rows, out)
    cpu_packed.unpack(weights.packed, weights.factors, rows, bits)
    q = weights.multiplied()[rows]
    scale, minimum = weights.per_input(weights.scale)[rows], weights.per_input(weights.minimum)[rows]
    fused, twice = rounded_once(q, scale, minimum), q.astype(np.float32) * scale + minimum
    assert np.all((out == fused) | (out == twice))
    np.testing.assert_array_equal(bits, bfloat16_bits(out))


@settings(max_examples=20, deadline=None)
@given(spec=specs(max_tokens=1), first=st.integers(0, 2), blocks=st.integers(1, 3))
def test_unpack_columns_writes_whole_blocks_transposed_as_unpack_widens_their_rows(spec, first, blocks) -> None:
    """Blocks ``first ..`` as columns, as many as the width holds or the weights have (the padded last block
    whole): each column the row ``unpack`` gives, bit for bit, float32 and bfloat16; columns past them
    untouched."""
    _, weights = spec.build()
    total = weights.packed.shape[0]
    first = min(first, total - 1)
    count = min(blocks, total - first)
    for dtype in (np.float32, np.uint16):
        columns = np.full((spec.size, 16 * blocks), 7, dtype)
        cpu_packed.unpack_columns(weights.packed, weights.factors, first, columns)
        rows = np.arange(16 * first, 16 * (first + count))
        real = rows[rows < spec.rows]
        expected = np.empty((real.size, spec.size), dtype)
        cpu_packed.unpack(weights.packed, weights.factors, real, expected)
        np.testing.assert_array_equal(columns[:, : real.size], expected.T)
        assert np.all(columns[:, 16 * count :] == 7)


@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_unpack_of_no_rows_writes_nothing(dtype) -> None:
    weights = weights_of(np.random.default_rng(2), 20, 2 * GROUP, 4, GROUP, with_offset=False, factors="float16")
    out = np.empty((0, 2 * GROUP), dtype)
    cpu_packed.unpack(weights.packed, weights.factors, np.zeros(0, np.int64), out)
    assert out.shape == (0, 2 * GROUP)


def pack(bits: int, size: int, factors: int) -> None:
    q, scale = np.zeros((2, size), np.uint8 if bits == 4 else np.int8), np.ones((2, factors), np.float32)
    cpu_packed.pack4(q, scale, scale) if bits == 4 else cpu_packed.pack8(q, scale)


@pytest.mark.parametrize(
    ("bits", "size", "factors", "message"),
    [
        (4, 48, 1, "input size 48 is not a multiple of 32"),
        (8, 80, 5, "input size 80 is not a multiple of 32"),
        (4, 64, 4, "4 factors per row of 64 inputs: groups must be 32$"),
        (4, 64, 0, "0 factors per row of 64 inputs: groups must be 32$"),
        (8, 64, 1, "1 factors per row of 64 inputs: groups must be 32 or 16"),
        (8, 64, 3, "3 factors per row of 64 inputs: groups must be 32 or 16"),
        (8, 64, 8, "8 factors per row of 64 inputs: groups must be 32 or 16"),
    ],
)
def test_packing_refuses_partial_groups_and_other_group_sizes(bits: int, size: int, factors: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pack(bits, size, factors)


@pytest.mark.parametrize("bits", [4, 8])
def test_coded_factors_need_whole_super_blocks(bits: int) -> None:
    q = np.zeros((2, 64), np.uint8 if bits == 4 else np.int8)
    codes = cpu_packed.Coded(np.ones((2, 1), np.float32), np.ones((2, 2), np.int8))
    with pytest.raises(ValueError, match="coded factors need whole super-blocks of 256 inputs"):
        cpu_packed.pack4(q, codes, codes) if bits == 4 else cpu_packed.pack8(q, codes, codes)


def test_coded_factors_that_float16_cannot_hold_are_packed_as_their_values() -> None:
    """A base float16 does not hold exactly: the factors are packed as float32 products, the same weights."""
    q = np.random.default_rng(3).integers(0, 16, (3, 256)).astype(np.uint8)
    scale = cpu_packed.Coded(np.full((3, 1), 1 / 3, np.float32), np.arange(24, dtype=np.int8).reshape(3, 8))
    packed, factors = cpu_packed.pack4(q, scale, scale)
    assert factors.dtype == np.float32
    np.testing.assert_array_equal(factors, cpu_packed.pack4(q, scale.values(), scale.values())[1])
