"""``hetero_kernels.simd`` against numpy: pair loads in each dtype and order, stores, sums."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba.core.errors import TypingError

from hetero_kernels import simd
from hetero_kernels.dtypes import FLOAT16_BITS_TO_FLOAT32, WIDEN_BFLOAT16, bfloat16_bits, widen


@njit(cache=False)
def _pair(array, index, table):
    first, second = simd.load_pair(array, index, table)
    out = np.empty(simd.PAIR, dtype=np.float32)
    simd.store_pair(out, 0, first, second, array, table)
    return out, simd.total(first), simd.total(second), simd.interleaves(array, table)


def _cases(values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]]:
    """``values`` as each cache dtype: (array, decode table, exact float32 values, read even elements first)."""
    halves = values.astype(np.float16)
    bits = bfloat16_bits(values)
    return [
        (values, WIDEN_BFLOAT16, values, False),
        (bits, WIDEN_BFLOAT16, widen(bits).astype(np.float32), True),
        (halves.view(np.uint16), FLOAT16_BITS_TO_FLOAT32, halves.astype(np.float32), False),
    ]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 16))
def test_a_pair_reads_32_elements_in_its_order_and_stores_them_back_in_the_natural_one(seed: int, index: int) -> None:
    values = np.random.default_rng(seed).standard_normal(index + simd.PAIR + 3).astype(np.float32)
    for array, table, exact, interleaved in _cases(values):
        out, first, second, interleaves = _pair(array, index, table)
        window = exact[index : index + simd.PAIR].astype(np.float64)
        np.testing.assert_array_equal(out, window.astype(np.float32))
        assert interleaves == interleaved
        one, other = (window[0::2], window[1::2]) if interleaved else (window[:16], window[16:])
        np.testing.assert_allclose([first, second], [one.sum(), other.sum()], rtol=1e-6, atol=1e-6)


@njit(cache=False)
def _dot(a, b):
    acc = simd.zeros()
    for c in range(0, a.shape[0], simd.PAIR):
        x, y = simd.load_pair(a, c)
        u, v = simd.load_pair(b, c)
        acc = simd.fma(y, v, simd.fma(x, u, acc))
    return simd.total(acc)


@njit(cache=False)
def _four_totals(rows):
    out = np.zeros(6, dtype=np.float32)
    a, b, c, d = (
        simd.load_pair(rows[0], 0)[0],
        simd.load_pair(rows[1], 0)[0],
        simd.load_pair(rows[2], 0)[0],
        simd.load_pair(rows[3], 0)[0],
    )
    simd.store_totals(out, 1, a, b, c, d)
    return out, np.array([simd.total(a), simd.total(b), simd.total(c), simd.total(d)], dtype=np.float32)


@njit(cache=False)
def _scaled(array, factor):
    out = np.empty(simd.PAIR, dtype=np.float32)
    first, second = simd.load_pair(array, 0)
    scale = simd.splat(factor)
    simd.store_pair(out, 0, simd.fma(first, scale, simd.zeros()), simd.fma(second, scale, simd.zeros()), array)
    return out


def test_dot_products_and_four_sums_at_once_match_numpy_and_each_other() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(128).astype(np.float32), rng.standard_normal(128).astype(np.float32)
    assert _dot(a, b) == pytest.approx(float(a.astype(np.float64) @ b), rel=1e-5)
    rows = rng.standard_normal((4, simd.PAIR)).astype(np.float32)
    out, alone = _four_totals(rows)
    np.testing.assert_array_equal(out[1:5], alone)  # the same order of additions, so the same bits
    assert out[0] == out[5] == 0  # nothing written around them
    np.testing.assert_allclose(alone, rows[:, :16].astype(np.float64).sum(1), rtol=1e-6)
    np.testing.assert_array_equal(_scaled(a, 0.5), a[: simd.PAIR] * np.float32(0.5))


def test_a_strided_or_two_dimensional_array_is_refused_at_compile_time() -> None:
    values = np.zeros((4, 64), dtype=np.float32)
    with pytest.raises(TypingError, match="contiguous 1-D"):
        _pair(values[:, 0], 0, WIDEN_BFLOAT16)
    with pytest.raises(TypingError, match="contiguous 1-D"):
        _pair(values, 0, WIDEN_BFLOAT16)
