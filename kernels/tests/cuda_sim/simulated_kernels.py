"""The CUDA kernels against the reference, on Numba's CUDA simulator.

Run only through ``test_cuda_simulator.py``, which starts pytest on this file
in a subprocess with ``NUMBA_ENABLE_CUDASIM=1`` (the simulator must be chosen
before ``numba.cuda`` is first imported, so it cannot share a process with
the other tests). The file name keeps the main test run from collecting it.

The simulator runs every GPU thread as a Python thread, so the launch shape is
shrunk (8 threads a block, chunks of 16 positions, 4 key dimensions staged at a
time, 2 query heads a block) and the problems are tiny; they still cross
thread tiles, chunks, staged dimension groups and head groups.
Tolerances: float32 accumulation against the float64 reference, atol 1e-5 / rtol 1e-4.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from numba import config, cuda  # noqa: E402

from hetero_kernels import cuda as kernels  # noqa: E402
from hetero_kernels import reference  # noqa: E402
from paged_problems import Problem, problems  # noqa: E402

kernels.configure(tile=8, tokens_per_split=16, key_dims=4, max_group=2)

ATOL, RTOL = 1e-5, 1e-4
tiny_problems = problems(max_batch=2, max_group=3, max_kv_heads=2, head_sizes=(1, 4, 6), block_sizes=(1, 3, 4), max_len=20)


def test_the_simulator_is_running_the_kernels() -> None:
    assert config.ENABLE_CUDASIM
    assert "simulator" in type(cuda.gpus).__module__


def test_launches_do_not_warn_of_small_grids() -> None:
    """On a GPU numba warns when a grid has fewer than 128 blocks, as a batch-1 decode's has by design."""
    import warnings

    class Kernel:
        def __getitem__(self, launch):
            warnings.warn(f"Grid size {launch[0]} will likely result in GPU under-utilization due to low occupancy.")
            return launch

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels._configured(Kernel(), 3, 128, 0) == (3, 128, 0)


def test_configure_refuses_launch_shapes_a_gpu_cannot_run() -> None:
    shape = (kernels.TILE, kernels.TOKENS_PER_SPLIT, kernels.MAX_GROUP)
    with pytest.raises(ValueError, match="up to 1024"):
        kernels.configure(tile=2048)
    with pytest.raises(ValueError, match="shared memory"):
        kernels.configure(tile=256, tokens_per_split=256, key_dims=32, max_group=8)
    assert (kernels.TILE, kernels.TOKENS_PER_SPLIT, kernels.MAX_GROUP) == shape
    assert kernels._prefill_shared_bytes(128, 256, 32, 4, 256) <= kernels.MAX_SHARED_BYTES  # the default shape


@settings(max_examples=10, deadline=None)
@given(tiny_problems)
def test_decode_and_prefill_match_reference(problem: Problem) -> None:
    expected, got = np.zeros_like(problem.query), np.zeros_like(problem.query)
    reference.paged_decode_attention(expected, *problem.decode_args)
    kernels.paged_decode_attention(got, *problem.decode_args)
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)

    expected, got = np.zeros_like(problem.prefill.query), np.zeros_like(problem.prefill.query)
    reference.paged_prefill_attention(expected, *problem.prefill_args)
    kernels.paged_prefill_attention(got, *problem.prefill_args)
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)


@settings(max_examples=3, deadline=None)
@given(tiny_problems)
def test_write_kv_matches_reference(problem: Problem) -> None:
    key, value, slots = problem.new_kv()
    k_expected, v_expected = problem.k_cache.copy(), problem.v_cache.copy()
    reference.write_kv(key, value, k_expected, v_expected, slots)
    kernels.write_kv(key, value, problem.k_cache, problem.v_cache, slots)
    np.testing.assert_array_equal(problem.k_cache, k_expected)
    np.testing.assert_array_equal(problem.v_cache, v_expected)
