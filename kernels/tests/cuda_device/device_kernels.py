"""The CUDA kernels on a real GPU, with their default launch shape, against the reference.

Run only through ``test_cuda_device.py`` (in a subprocess, so ``numba.cuda``
is never initialised in the main test process), and only where a CUDA GPU is
present. Numba device arrays and torch CUDA tensors (when torch has CUDA) are
both exercised; contexts run long enough to cross several decode chunks.
Tolerances: float32 accumulation against the float64 reference, atol 5e-5 / rtol 5e-4.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from numba import cuda

from hetero_kernels import cuda as kernels
from hetero_kernels import reference
from paged_problems import Problem, problems

ATOL, RTOL = 5e-5, 5e-4
gpu_problems = problems(max_batch=4, max_group=8, max_kv_heads=3, head_sizes=(8, 64, 80, 128), block_sizes=(1, 16, 32), max_len=1200)


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


@settings(max_examples=10, deadline=None)
@given(gpu_problems)
def test_torch_tensors_on_the_current_stream(problem: Problem) -> None:
    import pytest

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        args = [torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in problem.decode_args]
        out = torch.empty(problem.query.shape, dtype=torch.float32, device="cuda")
        kernels.paged_decode_attention(out, *args)
        key, value, slots = problem.new_kv()
        kernels.write_kv(*(torch.from_numpy(a).cuda() for a in (key, value)), args[1], args[2], torch.from_numpy(slots).cuda())
    stream.synchronize()
    expected = np.zeros_like(problem.query)
    reference.paged_decode_attention(expected, *problem.decode_args)
    np.testing.assert_allclose(out.cpu().numpy(), expected, atol=ATOL, rtol=RTOL)
    k_expected = problem.k_cache.copy()
    reference.write_kv(key, value, k_expected, problem.v_cache.copy(), slots)
    np.testing.assert_array_equal(args[1].cpu().numpy(), k_expected)
