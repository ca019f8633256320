"""The CUDA kernels on a real GPU, with their default launch shape, against the reference.

Run only through ``test_cuda_device.py`` (in a subprocess, so ``numba.cuda``
is never initialised in the main test process), and only where a CUDA GPU is
present. Numba device arrays and torch CUDA tensors (when torch has CUDA) are
both exercised; contexts run long enough to cross several decode chunks.
Tolerances: float32 accumulation against the float64 reference, atol 5e-5 / rtol 5e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from numba import cuda
from paged_problems import BFLOAT16, Problem, problems

from hetero_kernels import cuda as kernels
from hetero_kernels import reference
from hetero_kernels.dtypes import widen

ATOL, RTOL = 5e-5, 5e-4
gpu_problems = problems(
    max_batch=4,
    max_group=8,
    max_kv_heads=3,
    head_sizes=(8, 64, 80, 128),
    block_sizes=(1, 16, 32),
    max_len=1200,
    cache_dtypes=(np.float32, np.float16, BFLOAT16),
)


def on_device(problem: Problem, args: tuple) -> list:
    return [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]


@settings(max_examples=25, deadline=None)
@given(gpu_problems)
def test_decode_and_prefill_match_reference_on_the_gpu(problem: Problem) -> None:
    expected = np.zeros_like(problem.query)
    reference.paged_decode_attention(expected, *problem.decode_args)
    out = cuda.device_array(problem.query.shape, np.float32)
    kernels.paged_decode_attention(out, *on_device(problem, problem.decode_args))
    np.testing.assert_allclose(out.copy_to_host(), expected, atol=ATOL, rtol=RTOL)

    expected = np.zeros_like(problem.prefill.query)
    reference.paged_prefill_attention(expected, *problem.prefill_args)
    out = cuda.device_array(problem.prefill.query.shape, np.float32)
    kernels.paged_prefill_attention(out, *on_device(problem, problem.prefill_args))
    np.testing.assert_allclose(out.copy_to_host(), expected, atol=ATOL, rtol=RTOL)


def torch_with_cuda():
    """torch, or a skip where it is missing or has no CUDA."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


@settings(max_examples=10, deadline=None)
@given(gpu_problems)
def test_torch_tensors_on_the_current_stream(problem: Problem) -> None:
    torch = torch_with_cuda()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        args = [torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in problem.decode_args]
        out = torch.empty(problem.query.shape, dtype=torch.float32, device="cuda")
        kernels.paged_decode_attention(out, *args)
        key, value, slots = problem.new_kv()
        kernels.write_kv(
            *(torch.from_numpy(a).cuda() for a in (key, value)), args[1], args[2], torch.from_numpy(slots).cuda()
        )
    stream.synchronize()
    expected = np.zeros_like(problem.query)
    reference.paged_decode_attention(expected, *problem.decode_args)
    np.testing.assert_allclose(out.cpu().numpy(), expected, atol=ATOL, rtol=RTOL)
    k_expected = problem.k_cache.copy()
    reference.write_kv(key, value, k_expected, problem.v_cache.copy(), slots)
    np.testing.assert_array_equal(args[1].cpu().numpy(), k_expected)


@settings(max_examples=10, deadline=None)
@given(gpu_problems)
def test_torch_bfloat16_tensors_in_and_out(problem: Problem) -> None:
    """A bfloat16 model's tensors as they are: bfloat16 queries, cache and output (rounded once)."""
    torch = torch_with_cuda()

    def bfloat16(a: np.ndarray):
        tensor = torch.from_numpy(a.astype(np.int16) if a.dtype == np.uint16 else a).cuda()
        return tensor.view(torch.bfloat16) if a.dtype == np.uint16 else tensor.bfloat16()

    query, k_cache, v_cache = bfloat16(problem.query), bfloat16(problem.k_cache), bfloat16(problem.v_cache)
    tables, lens = (torch.from_numpy(a).cuda() for a in (problem.block_tables, problem.context_lens))
    out = torch.empty_like(query)
    kernels.paged_decode_attention(out, query, k_cache, v_cache, tables, lens, problem.scale)
    as_numpy = lambda t: t.float().cpu().numpy()  # noqa: E731
    expected = np.zeros_like(problem.query)
    reference.paged_decode_attention(
        expected,
        as_numpy(query),
        as_numpy(k_cache),
        as_numpy(v_cache),
        problem.block_tables,
        problem.context_lens,
        problem.scale,
    )
    np.testing.assert_allclose(as_numpy(out), widen(expected.astype(np.float32)), atol=ATOL, rtol=1e-2)
