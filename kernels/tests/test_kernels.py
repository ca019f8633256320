"""The Numba CPU kernels and the reference, over hypothesis-generated paged-attention problems.

Tolerances: float32 inputs, float64 accumulation in the CPU kernel and the
reference, so they agree to atol 1e-5 / rtol 1e-4; the reference agrees with
a dense float64 softmax over contiguous K/V to 1e-10.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from hypothesis import given, settings, strategies as st

from hetero_kernels import cpu, reference

sys.path.insert(0, os.path.dirname(__file__))
from shapes import random_case  # noqa: E402

seeds = st.integers(0, 2**32 - 1)


def dense_attention(query, keys, values, scale, causal_offset=None):
    """Plain softmax attention over contiguous keys/values, GQA by repeating heads."""
    group = query.shape[-2] // keys.shape[1]
    keys = np.repeat(keys, group, axis=1).astype(np.float64)
    values = np.repeat(values, group, axis=1).astype(np.float64)
    scores = np.einsum("thd,lhd->thl", query.astype(np.float64), keys) * scale
    if causal_offset is not None:
        visible = np.arange(keys.shape[0])[None, :] <= (causal_offset + np.arange(query.shape[0]))[:, None]
        scores = np.where(visible[:, None, :], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("thl,lhd->thd", weights / weights.sum(-1, keepdims=True), values)


@settings(max_examples=60, deadline=None)
@given(seeds)
def test_decode_cpu_matches_reference(seed: int) -> None:
    case = random_case(np.random.default_rng(seed))
    expected, got = np.zeros_like(case.query), np.zeros_like(case.query)
    reference.paged_decode_attention(expected, case.query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
    cpu.paged_decode_attention(got, case.query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


@settings(max_examples=60, deadline=None)
@given(seeds)
def test_prefill_cpu_matches_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    case = random_case(rng)
    chunks = case.prefill_chunks(rng)
    expected, got = np.zeros_like(chunks.query), np.zeros_like(chunks.query)
    args = (case.k_cache, case.v_cache, case.block_tables, chunks.query_start_loc, case.context_lens, case.scale)
    reference.paged_prefill_attention(expected, chunks.query, *args)
    cpu.paged_prefill_attention(got, chunks.query, *args)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


@settings(max_examples=30, deadline=None)
@given(seeds)
def test_write_kv_cpu_matches_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    case = random_case(rng)
    key, value, slots = case.new_kv(rng)
    k_expected, v_expected = case.k_cache.copy(), case.v_cache.copy()
    reference.write_kv(key, value, k_expected, v_expected, slots)
    cpu.write_kv(key, value, case.k_cache, case.v_cache, slots)
    np.testing.assert_array_equal(case.k_cache, k_expected)
    np.testing.assert_array_equal(case.v_cache, v_expected)


@settings(max_examples=30, deadline=None)
@given(seeds)
def test_reference_equals_dense_attention(seed: int) -> None:
    rng = np.random.default_rng(seed)
    case = random_case(rng)
    chunks = case.prefill_chunks(rng)
    out = np.zeros(chunks.query.shape, dtype=np.float64)
    reference.paged_prefill_attention(out, chunks.query, case.k_cache, case.v_cache, case.block_tables, chunks.query_start_loc, case.context_lens, case.scale)
    for b in range(len(case.context_lens)):
        length = int(case.context_lens[b])
        keys = reference.gather(case.k_cache, case.block_tables[b], length)
        values = reference.gather(case.v_cache, case.block_tables[b], length)
        rows = slice(chunks.query_start_loc[b], chunks.query_start_loc[b + 1])
        q_len = rows.stop - rows.start
        expected = dense_attention(chunks.query[rows], keys, values, case.scale, causal_offset=length - q_len)
        np.testing.assert_allclose(out[rows], expected, atol=1e-10)


def test_long_context_is_numerically_stable() -> None:
    """Large scores overflow a naive exp; the online softmax must not."""
    rng = np.random.default_rng(5)
    case = random_case(rng, max_batch=1, max_len=4000)
    case.query *= 300.0
    got = np.zeros_like(case.query)
    cpu.paged_decode_attention(got, case.query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
    expected = np.zeros_like(case.query)
    reference.paged_decode_attention(expected, case.query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-3)
