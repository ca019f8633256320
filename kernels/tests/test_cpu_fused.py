"""The fused layer kernels against numpy in float64: RoPE, cache writes and attention, norms, SwiGLU.

That bfloat16 activations round where torch's ops round is checked against
torch itself, in the torch executor's tests (``test_fused_layers.py``).
"""

from __future__ import annotations

import attrs
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from paged_problems import BFLOAT16, GARBAGE, Problem, problems

from hetero_kernels import cpu_fused, reference
from hetero_kernels.dtypes import bfloat16_bits, widen

EVEN_HEAD_SIZES = (2, 4, 8, 16, 64)  # rotate-half RoPE pairs the two halves of a head


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE of heads ``x`` [B, heads, D] with ``cos``/``sin`` [B, D], in float64."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def step_of(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A decode step for ``problem``: fused q/k/v rows, the RoPE tables of each sequence's last position,
    and the slots of those positions (where the new keys and values go)."""
    rng = np.random.default_rng(problem.seed + 2)
    batch, heads, head_size = problem.query.shape
    kv_heads, block_size = problem.k_cache.shape[2], problem.k_cache.shape[1]
    qkv = rng.standard_normal((batch, (heads + 2 * kv_heads) * head_size)).astype(np.float32)
    last = problem.context_lens - 1
    angles = last[:, None] * (1e4 ** -(np.arange(head_size // 2) / (head_size // 2)))[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    slots = (problem.block_tables[np.arange(batch), last // block_size] * block_size + last % block_size).astype(
        np.int64
    )
    return qkv, np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32), slots


def expected_step(problem: Problem, qkv, cos, sin, slots) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batch, heads, head_size = problem.query.shape
    kv_heads = problem.k_cache.shape[2]
    parts = qkv.astype(np.float64).reshape(batch, heads + 2 * kv_heads, head_size)
    query = rotate(parts[:, :heads], cos, sin)
    key = rotate(parts[:, heads : heads + kv_heads], cos, sin)
    k_cache, v_cache = widen(problem.k_cache), widen(problem.v_cache)
    reference.write_kv(key, parts[:, heads + kv_heads :], k_cache, v_cache, slots)
    out = np.zeros_like(query)
    reference.paged_decode_attention(
        out, query, k_cache, v_cache, problem.block_tables, problem.context_lens, problem.scale
    )
    return out, k_cache, v_cache


def attend(out, qkv, cos, sin, slots, problem: Problem, keys_first: bool = False) -> None:
    """The kernel on ``problem``'s caches, tables and lengths."""
    cpu_fused.rotary_decode_attention(
        out,
        qkv,
        cos,
        sin,
        problem.k_cache,
        problem.v_cache,
        slots,
        problem.block_tables,
        problem.context_lens,
        problem.query.shape[1],
        problem.scale,
        keys_first,
    )


@settings(max_examples=40, deadline=None)
@given(problems(cache_dtypes=(np.float32,), head_sizes=EVEN_HEAD_SIZES))
def test_rotary_decode_attention_matches_reference_in_float32(problem: Problem) -> None:
    qkv, cos, sin, slots = step_of(problem)
    expected, k_expected, v_expected = expected_step(problem, qkv, cos, sin, slots)
    out = np.zeros(problem.query.shape, dtype=np.float32)
    attend(out, qkv, cos, sin, slots, problem)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(problem.k_cache, k_expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(problem.v_cache, v_expected)


@settings(max_examples=40, deadline=None)
@given(problems(max_batch=1, cache_dtypes=(np.float32,), head_sizes=EVEN_HEAD_SIZES), st.integers(1, 9))
def test_rows_of_one_sequence_attend_up_to_their_own_positions(problem: Problem, rows: int) -> None:
    """A step verifying proposals: the sequence's last ``rows`` positions are new, each row attends to the
    sequence up to itself, the rows before it included (keys written first: their slots hold garbage
    before the call)."""
    length = int(problem.context_lens[0])
    rows = min(rows, length)
    verify = attrs.evolve(
        problem,
        query=np.zeros((rows, *problem.query.shape[1:]), dtype=np.float32),
        block_tables=np.repeat(problem.block_tables[:1], rows, axis=0),
        context_lens=np.arange(length - rows + 1, length + 1, dtype=np.int32),
    )
    qkv, cos, sin, slots = step_of(verify)
    for cache in (verify.k_cache, verify.v_cache):
        cache.reshape(-1, *cache.shape[2:])[slots] = GARBAGE
    expected, k_expected, v_expected = expected_step(verify, qkv, cos, sin, slots)
    out = np.zeros(verify.query.shape, dtype=np.float32)
    attend(out, qkv, cos, sin, slots, verify, keys_first=True)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(verify.k_cache, k_expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(verify.v_cache, v_expected)


@settings(max_examples=40, deadline=None)
@given(problems(cache_dtypes=(BFLOAT16,), head_sizes=EVEN_HEAD_SIZES))
def test_rotary_decode_attention_in_bfloat16(problem: Problem) -> None:
    """Activations and cache as bfloat16 bits: within bfloat16's rounding of the float64 result."""
    qkv, cos, sin, slots = step_of(problem)
    qkv, cos, sin = bfloat16_bits(qkv), bfloat16_bits(cos), bfloat16_bits(sin)
    expected, k_expected, v_expected = expected_step(problem, widen(qkv), widen(cos), widen(sin), slots)
    out = np.zeros(problem.query.shape, dtype=np.uint16)
    attend(out, qkv, cos, sin, slots, problem)
    # RoPE rounds three times to bfloat16 (2**-8 relative each), attention once more
    np.testing.assert_allclose(widen(problem.k_cache), k_expected, atol=1e-2, rtol=2e-2)
    np.testing.assert_allclose(widen(out), expected, atol=5e-2, rtol=5e-2)
    np.testing.assert_array_equal(widen(problem.v_cache), v_expected)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 3, 40]), st.sampled_from([1, 8, 64, 576]), st.integers(0, 2**31 - 1), st.booleans())
def test_rms_norm_matches_reference(rows: int, size: int, seed: int, bfloat16: bool) -> None:
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((rows, size)).astype(np.float32) * 3
    delta = rng.standard_normal((rows, size)).astype(np.float32)
    weight = rng.standard_normal(size).astype(np.float32)
    delta_in = bfloat16_bits(delta) if bfloat16 else delta
    total = hidden.astype(np.float64) + widen(delta_in)
    expected = total / np.sqrt((total**2).mean(-1, keepdims=True) + 1e-5) * weight
    out = np.empty((rows, size), dtype=np.uint16 if bfloat16 else np.float32)
    cpu_fused.rms_norm(hidden, weight, 1e-5, out, delta_in)
    np.testing.assert_allclose(hidden, total, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(widen(out), expected, rtol=1e-2 if bfloat16 else 1e-5, atol=1e-2 if bfloat16 else 1e-5)
    cpu_fused.rms_norm(hidden, weight, 1e-5, out)
    np.testing.assert_allclose(widen(out), expected, rtol=1e-2 if bfloat16 else 1e-5, atol=1e-2 if bfloat16 else 1e-5)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 3, 40]), st.sampled_from([1, 8, 1536]), st.integers(0, 2**31 - 1), st.booleans())
def test_swiglu_matches_reference(rows: int, size: int, seed: int, bfloat16: bool) -> None:
    """Gates far out on both sides too: SiLU is about 0 below -20 and the identity above 20."""
    rng = np.random.default_rng(seed)
    gate_up = rng.standard_normal((rows, 2 * size)).astype(np.float32) * rng.choice(
        [1, 10, 100], (rows, 2 * size)
    ).astype(np.float32)
    gate_up_in = bfloat16_bits(gate_up) if bfloat16 else gate_up
    gate, up = np.split(widen(gate_up_in), 2, axis=-1)
    expected = gate / (1 + np.exp(-gate)) * up
    out = np.empty((rows, size), dtype=np.uint16 if bfloat16 else np.float32)
    cpu_fused.swiglu(gate_up_in, out)
    tolerance = 2 * 2.0**-8 if bfloat16 else 1e-6  # bfloat16: the SiLU and the product each rounded
    np.testing.assert_allclose(widen(out), expected, rtol=tolerance, atol=1e-30)


@settings(max_examples=40, deadline=None)
@given(problems(cache_dtypes=(np.float32, BFLOAT16), head_sizes=EVEN_HEAD_SIZES))
def test_rotary_write_matches_reference(problem: Problem) -> None:
    """Rotated queries and keys out, keys and values into their slots; a negative slot writes nothing."""
    _, heads, head_size = problem.query.shape
    kv_heads = problem.k_cache.shape[2]
    _, _, slots = problem.new_kv()
    rng = np.random.default_rng(problem.seed + 3)
    qkv = rng.standard_normal((len(slots), (heads + 2 * kv_heads) * head_size)).astype(np.float32)
    angles = rng.uniform(0, 100, (len(slots), head_size // 2))
    cos, sin = (
        np.cos(np.concatenate([angles, angles], -1)).astype(np.float32),
        np.sin(np.concatenate([angles, angles], -1)).astype(np.float32),
    )
    bf16 = problem.k_cache.dtype == np.uint16
    if bf16:
        qkv, cos, sin = bfloat16_bits(qkv), bfloat16_bits(cos), bfloat16_bits(sin)
    parts = widen(qkv).reshape(len(slots), heads + 2 * kv_heads, head_size)
    expected_query = rotate(parts[:, :heads], widen(cos), widen(sin))
    expected_key = rotate(parts[:, heads : heads + kv_heads], widen(cos), widen(sin))
    k_expected, v_expected = widen(problem.k_cache), widen(problem.v_cache)
    reference.write_kv(expected_key, parts[:, heads + kv_heads :], k_expected, v_expected, slots)
    query = np.empty((len(slots), heads, head_size), dtype=qkv.dtype)
    key = np.empty((len(slots), kv_heads, head_size), dtype=qkv.dtype)
    cpu_fused.rotary_write(query, key, qkv, cos, sin, problem.k_cache, problem.v_cache, slots)
    tolerance = dict(atol=1e-2, rtol=2e-2) if bf16 else dict(atol=1e-5, rtol=1e-5)  # bf16: three roundings
    np.testing.assert_allclose(widen(query), expected_query, **tolerance)
    np.testing.assert_allclose(widen(key), expected_key, **tolerance)
    np.testing.assert_allclose(widen(problem.k_cache), k_expected, **tolerance)
    np.testing.assert_array_equal(widen(problem.v_cache), v_expected)
