"""The Numba CPU kernels against the reference over hypothesis-generated problems.

Tolerances: queries float32 (with a bfloat16 cache, sometimes bfloat16
numbers, which take the dot-product scores of ``cpu_scores``), caches
float32, float16 or bfloat16 (as raw bits); the CPU kernels accumulate in float32 (reassociated), the reference in
float64 from the same values, so they agree to atol 1e-5 / rtol 1e-4.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from numba import njit
from paged_problems import BFLOAT16, Problem, problems

from hetero_kernels import cpu, reference

ATOL, RTOL = 1e-5, 1e-4
CACHE_DTYPES = (np.float32, np.float16, BFLOAT16)


@settings(max_examples=60, deadline=None)
@given(problems(cache_dtypes=CACHE_DTYPES))
def test_decode_matches_reference(problem: Problem) -> None:
    expected, got = np.zeros_like(problem.query), np.zeros_like(problem.query)
    reference.paged_decode_attention(expected, *problem.decode_args)
    cpu.paged_decode_attention(got, *problem.decode_args)
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)


@settings(max_examples=60, deadline=None)
@given(problems(cache_dtypes=CACHE_DTYPES))
def test_prefill_matches_reference(problem: Problem) -> None:
    expected, got = np.zeros_like(problem.prefill.query), np.zeros_like(problem.prefill.query)
    reference.paged_prefill_attention(expected, *problem.prefill_args)
    cpu.paged_prefill_attention(got, *problem.prefill_args)
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)


@settings(max_examples=30, deadline=None)
@given(problems(cache_dtypes=CACHE_DTYPES))
def test_write_kv_matches_reference(problem: Problem) -> None:
    key, value, slots = problem.new_kv()
    k_expected, v_expected = problem.k_cache.copy(), problem.v_cache.copy()
    reference.write_kv(key, value, k_expected, v_expected, slots)
    cpu.write_kv(key, value, problem.k_cache, problem.v_cache, slots)
    np.testing.assert_array_equal(problem.k_cache, k_expected)
    np.testing.assert_array_equal(problem.v_cache, v_expected)


def test_long_context_with_large_scores_stays_finite() -> None:
    """Scores in the hundreds overflow a naive exp; the online softmax keeps them finite and exact."""
    rng = np.random.default_rng(5)
    k_cache = rng.standard_normal((300, 16, 2, 32)).astype(np.float32)
    v_cache = rng.standard_normal((300, 16, 2, 32)).astype(np.float32)
    tables = rng.permutation(300).astype(np.int32).reshape(1, 300)
    lens = np.array([4000], dtype=np.int32)
    query = 300.0 * rng.standard_normal((1, 4, 32)).astype(np.float32)
    expected, got = np.zeros_like(query), np.zeros_like(query)
    reference.paged_decode_attention(expected, query, k_cache, v_cache, tables, lens, 32**-0.5)
    cpu.paged_decode_attention(got, query, k_cache, v_cache, tables, lens, 32**-0.5)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)


@njit
def _weigh(scores, out):
    for i in range(scores.shape[0]):
        out[i] = cpu._weight(scores[i])


def test_softmax_weights_are_exp_to_float32_precision_and_zero_below_the_cutoff() -> None:
    """The kernels' own exp (vectorisable arithmetic, not a call per element) over every score a
    softmax can see: 0 down to the cutoff, then exactly 0."""
    scores = -np.linspace(0, 70, 700_001, dtype=np.float32)
    weights = np.empty_like(scores)
    _weigh(scores, weights)
    kept = scores > cpu.NEGLIGIBLE
    np.testing.assert_allclose(weights[kept], np.exp(scores[kept].astype(np.float64)), rtol=3e-7, atol=0)
    assert weights[0] == 1.0
    assert not weights[~kept].any()


@njit
def _exp(values, out):
    for i in range(values.shape[0]):
        out[i] = cpu.exp(values[i])


def test_exp_is_float32_precise_from_minus_87_to_88_and_clamped_outside() -> None:
    values = np.linspace(-87, 88, 1_750_001, dtype=np.float32)
    got = np.empty_like(values)
    _exp(values, got)
    np.testing.assert_allclose(got, np.exp(values.astype(np.float64)), rtol=3e-7, atol=0)
    _exp(np.array([-1e4, -87, 88, 1e4], dtype=np.float32), got[:4])
    assert got[0] == got[1] and got[2] == got[3] and np.isfinite(got[:4]).all()
