"""The bfloat16 dot-product attention scores against numpy in float64: products of bfloat16 numbers are exact, so
only float32 sums round."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba.core.errors import TypingError

from hetero_kernels import cpu_scores
from hetero_kernels.dtypes import bfloat16_bits, widen

pytestmark = pytest.mark.skipif(
    not cpu_scores.SUPPORTED,
    reason="this CPU has no AVX-512 BF16, Numba does not compile for it,"
    " or HETERO_KERNELS_PORTABLE forces the portable paths",
)
POSITIONS = cpu_scores.POSITIONS


@njit
def _all_blocks(scores, q_pairs, keys, rows, first_kv_head, per_kv_head, scale):
    for first in range(0, rows.shape[0], POSITIONS):
        for kv_head in range(q_pairs.shape[0] // per_kv_head):
            cpu_scores.block(
                scores, q_pairs, keys, rows, first, first_kv_head + kv_head, kv_head * per_kv_head, per_kv_head, scale
            )


def _bfloat16_numbers(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (bfloat16_bits(rng.standard_normal(shape)).astype(np.uint32) << 16).view(np.float32)


@settings(max_examples=40, deadline=None)
@given(
    count=st.integers(1, 70),
    kv_heads=st.integers(1, 3),
    per_kv_head=st.integers(1, 9),
    head_size=st.sampled_from([32, 64, 128]),
    seed=st.integers(0, 2**31 - 1),
)
def test_scores_match_float64(count: int, kv_heads: int, per_kv_head: int, head_size: int, seed: int) -> None:
    """Every query row against its own KV head, positions at rows scattered over the cache (whole and
    partial blocks of sixteen), the scale applied once at the end."""
    rng = np.random.default_rng(seed)
    first_kv_head = int(rng.integers(0, 2))
    cache_heads = first_kv_head + kv_heads
    keys = bfloat16_bits(rng.standard_normal((count + 40, cache_heads * head_size)))
    rows = rng.permutation(count + 40)[:count].astype(np.int64)
    q = _bfloat16_numbers(rng, (kv_heads * per_kv_head, head_size))
    pairs = cpu_scores.bfloat16_pairs(q)
    assert pairs.shape == (q.shape[0], head_size // 2)
    scale = np.float32(head_size**-0.5)
    width = -(-count // POSITIONS) * POSITIONS
    scores = np.full((q.shape[0], width), np.nan, dtype=np.float32)
    _all_blocks(scores, pairs, keys, rows, first_kv_head, per_kv_head, scale)

    wide = widen(keys)[rows]
    for r in range(q.shape[0]):
        head = first_kv_head + r // per_kv_head
        products = wide[:, head * head_size : (head + 1) * head_size] * q[r].astype(np.float64)
        expected = products.sum(axis=1) * np.float64(scale)
        bound = 2 * head_size * np.finfo(np.float32).eps * (np.abs(products).sum(axis=1) * scale + np.abs(expected))
        assert (np.abs(scores[r, :count] - expected) <= bound).all()
        assert np.isfinite(scores[r, count:]).all()  # the padding: repeats of the last position


def test_pairs_only_of_bfloat16_numbers_and_whole_words() -> None:
    """Queries that are not all bfloat16 numbers, or a head size the transposes do not cover, give no
    pairs (the caller computes those scores in float32)."""
    rng = np.random.default_rng(0)
    q = _bfloat16_numbers(rng, (3, 64))
    pairs = cpu_scores.bfloat16_pairs(q)
    assert (pairs & 0xFFFF == q.view(np.uint32)[:, 0::2] >> 16).all() and (
        pairs >> 16 == q.view(np.uint32)[:, 1::2] >> 16
    ).all()
    q[2, 17] = np.nextafter(q[2, 17], np.float32(np.inf))
    assert cpu_scores.bfloat16_pairs(q).shape[0] == 0
    assert cpu_scores.bfloat16_pairs(_bfloat16_numbers(rng, (3, 40))).shape[0] == 0


def test_a_float32_cache_is_refused_when_compiled() -> None:
    keys = np.zeros((16, 64), dtype=np.float32)
    with pytest.raises(TypingError, match="keys must be a contiguous 2-D array of uint16"):
        _all_blocks(
            np.zeros((1, 16), np.float32), np.zeros((1, 32), np.uint32), keys, np.arange(16), 0, 1, np.float32(1.0)
        )
