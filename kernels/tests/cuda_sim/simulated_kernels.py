"""The CUDA kernels against the reference, on Numba's CUDA simulator.

Run only through ``test_cuda_simulator.py``, which starts pytest on this file
in a subprocess with ``NUMBA_ENABLE_CUDASIM=1`` (the simulator must be chosen
before ``numba.cuda`` is first imported, so it cannot share a process with
the other tests). The file name keeps the main test run from collecting it.

The simulator runs every GPU thread as a Python thread, so the launch shape is
shrunk (8 threads a block, a word of a row per thread, so 1 to 8 threads a
row, 2 rows a step, chunks of 4 to 16 positions, 2 query heads a block) and
the problems are tiny; they still cross steps, row groups, chunks of every
length a launch may pick and head groups, with odd head sizes (a word per
element) and even ones (two 16-bit elements a word). Caches are float32, float16 and bfloat16 bits.
Tolerances: float32 accumulation against the float64 reference, atol 1e-5 / rtol 1e-4;
a 16-bit output adds its own rounding.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from numba import config, cuda  # noqa: E402
from paged_problems import BFLOAT16, Problem, problems  # noqa: E402

from hetero_kernels import cuda as kernels  # noqa: E402
from hetero_kernels import reference  # noqa: E402
from hetero_kernels.cuda_interop import configured  # noqa: E402
from hetero_kernels.dtypes import bfloat16_bits, widen  # noqa: E402

kernels.configure(tile=8, words_per_lane=1, rows_per_step=2, tokens_per_split=16, min_tokens_per_split=4, max_group=2)

ATOL, RTOL = 1e-5, 1e-4
tiny_problems = problems(
    max_batch=2,
    max_group=3,
    max_kv_heads=2,
    head_sizes=(1, 4, 6),
    block_sizes=(1, 3, 4),
    max_len=20,
    cache_dtypes=(np.float32, np.float16, BFLOAT16),
)


def test_the_simulator_is_running_the_kernels() -> None:
    assert config.ENABLE_CUDASIM
    assert "simulator" in type(cuda.gpus).__module__


def test_launches_do_not_warn_of_small_grids() -> None:
    """On a GPU numba-cuda warns when a grid has fewer than 128 blocks, as a batch-1 decode's has by
    design: its own warning class (not numba's), the message wrapped in terminal colour codes."""
    import warnings

    from numba.cuda.core.errors import NumbaPerformanceWarning

    class Kernel:
        def __getitem__(self, launch):
            message = f"Grid size {launch[0]} will likely result in GPU under-utilization due to low occupancy."
            warnings.warn(NumbaPerformanceWarning(message), stacklevel=2)
            return launch

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert configured(Kernel(), 3, 128, 0) == (3, 128, 0)


def test_configure_refuses_launch_shapes_a_gpu_cannot_run() -> None:
    shape = (kernels.TILE, kernels.TOKENS_PER_SPLIT, kernels.MAX_GROUP)
    with pytest.raises(ValueError, match="up to 1024"):
        kernels.configure(tile=2048)
    with pytest.raises(ValueError, match="shared memory"):
        kernels.configure(tile=1024, max_group=8)
    with pytest.raises(ValueError, match="words_per_lane"):
        kernels.configure(words_per_lane=0)
    assert (kernels.TILE, kernels.TOKENS_PER_SPLIT, kernels.MAX_GROUP) == shape
    assert kernels._shared_bytes(128, 4, 256) <= kernels.MAX_SHARED_BYTES  # the default shape


def test_decode_chunks_shorten_until_a_small_batch_fills_the_gpu() -> None:
    # here chunks are 4 to 16 positions; 8 multiprocessors, two blocks each
    assert kernels.split_length(1, 3, 48, 8) == 8  # one sequence of 3 head groups wants 6 chunks of 48 positions
    assert kernels.split_length(2, 3, 48, 8) == 16  # 3 chunks
    assert kernels.split_length(64, 3, 48, 8) == kernels.TOKENS_PER_SPLIT  # a large batch fills the GPU already
    assert kernels.split_length(1, 3, 8, 8) == kernels.MIN_TOKENS_PER_SPLIT


@settings(max_examples=12, deadline=None)
@given(tiny_problems, st.sampled_from([1, 3, 16]))
def test_decode_and_prefill_match_reference(problem: Problem, multiprocessors: int) -> None:
    kernels._MULTIPROCESSORS[None] = multiprocessors  # decode chunks of every length the launch may pick
    expected, got = np.zeros_like(problem.query), np.zeros_like(problem.query)
    reference.paged_decode_attention(expected, *problem.decode_args)
    kernels.paged_decode_attention(got, *problem.decode_args)
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)

    expected, got = np.zeros_like(problem.prefill.query), np.zeros_like(problem.prefill.query)
    reference.paged_prefill_attention(expected, *problem.prefill_args)
    kernels.paged_prefill_attention(got, *problem.prefill_args)
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)


@settings(max_examples=4, deadline=None)
@given(
    problems(
        max_batch=2,
        max_group=2,
        max_kv_heads=1,
        head_sizes=(4,),
        block_sizes=(4,),
        max_len=60,
        cache_dtypes=(np.float16,),
    )
)
def test_decode_merges_more_chunks_than_the_merge_takes_at_once(problem: Problem) -> None:
    """Chunks of 4 positions (many multiprocessors to fill): up to 15 of them, past the 8 a merge block weighs
    at once."""
    kernels._MULTIPROCESSORS[None] = 64
    expected, got = np.zeros_like(problem.query), np.zeros_like(problem.query)
    reference.paged_decode_attention(expected, *problem.decode_args)
    kernels.paged_decode_attention(got, *problem.decode_args)
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)


@settings(max_examples=6, deadline=None)
@given(tiny_problems, st.sampled_from([np.float16, BFLOAT16]))
def test_16_bit_queries_and_outputs(problem: Problem, dtype) -> None:
    """Queries and outputs in a 16-bit model's dtype: the queries widen exactly, the output is the
    float32 result rounded once (to nearest even, for bfloat16 bits)."""
    to_16_bits = bfloat16_bits if dtype == BFLOAT16 else lambda a: a.astype(np.float16)
    query = to_16_bits(problem.query)
    expected = np.zeros_like(problem.query)
    reference.paged_decode_attention(expected, widen(query).astype(np.float32), *problem.decode_args[1:])
    got = np.zeros_like(query)
    kernels.paged_decode_attention(got, query, *problem.decode_args[1:])
    np.testing.assert_allclose(widen(got), widen(to_16_bits(expected)), atol=ATOL, rtol=1e-2)

    query = to_16_bits(problem.prefill.query)
    expected = np.zeros_like(problem.prefill.query)
    reference.paged_prefill_attention(expected, widen(query).astype(np.float32), *problem.prefill_args[1:])
    got = np.zeros_like(query)
    kernels.paged_prefill_attention(got, query, *problem.prefill_args[1:])
    np.testing.assert_allclose(widen(got), widen(to_16_bits(expected)), atol=ATOL, rtol=1e-2)


@settings(max_examples=4, deadline=None)
@given(tiny_problems)
def test_write_kv_matches_reference(problem: Problem) -> None:
    key, value, slots = problem.new_kv()
    k_expected, v_expected = problem.k_cache.copy(), problem.v_cache.copy()
    reference.write_kv(key, value, k_expected, v_expected, slots)
    kernels.write_kv(key, value, problem.k_cache, problem.v_cache, slots)
    np.testing.assert_array_equal(problem.k_cache, k_expected)
    np.testing.assert_array_equal(problem.v_cache, v_expected)
