"""The decoder layer's small ops on CUDA, one kernel each where torch launches several.

The same three functions as :mod:`hetero_kernels.cpu_fused`, computing the
same values in the same roundings (torch's ops, each result rounded to the
activations' dtype; the norm's sum of squares in float64, so its mean comes
out correctly rounded to float32 whatever the order):

- :func:`rms_norm`: the residual add and RMSNorm (torch: an add, the norm, a
  conversion);
- :func:`rotary_write`: rotate-half RoPE of the queries and keys and the
  cache write of the keys and values (torch: five element-wise ops, a
  concatenation, two index copies);
- :func:`swiglu`: ``silu(gate) * up`` (torch: two).

At batch 1 a decode step is hundreds of kernels of a microsecond or two,
each costing about as much again to start: fewer kernels is what makes it
faster. Inputs are torch CUDA tensors (launched on torch's current stream,
so a captured CUDA graph records them), numba device arrays or numpy arrays;
16-bit arrays may be float16 or bfloat16 (a torch bfloat16 tensor, or its
bits as ``uint16``/``int16``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64

from hetero_kernels.cpu_fused import SILU_ZERO_BELOW
from hetero_kernels.cuda_elements import narrow, rounded, widen
from hetero_kernels.cuda_interop import LaunchContext, configured, device_array

THREADS = 256  # threads per block (a power of two)


def configure(*, threads: int) -> None:
    """The threads per block (the simulator tests use a few); only before the first launch."""
    global THREADS
    if any(
        getattr(kernel, "overloads", None)
        for kernel in (_rms_norm_kernel, _add_rms_norm_kernel, _rotary_write_kernel, _swiglu_kernel)
    ):
        raise RuntimeError("hetero_kernels.cuda_fused.configure() must run before the first kernel launch")
    if threads < 1 or threads > 1024 or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two up to 1024, got {threads}")
    THREADS = threads


@cuda.jit(device=True)
def _normalize_row(hidden, weight, eps, out, t):
    """``out[t]`` = RMSNorm of ``hidden[t]`` in torch's order: ``(x * rsqrt(mean + eps)) * w``."""
    tid, size = cuda.threadIdx.x, hidden.shape[1]
    partial = cuda.shared.array(THREADS, float64)
    total = float64(0.0)
    for i in range(tid, size, THREADS):
        total += float64(hidden[t, i]) * float64(hidden[t, i])
    partial[tid] = total
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if tid < stride:
            partial[tid] += partial[tid + stride]
        cuda.syncthreads()
        stride //= 2
    inverse = float32(1.0) / math.sqrt(float32(partial[0] / size) + eps)
    for i in range(tid, size, THREADS):
        out[t, i] = narrow(out, (hidden[t, i] * inverse) * weight[i])


@cuda.jit
def _rms_norm_kernel(hidden, weight, eps, out):
    _normalize_row(hidden, weight, eps, out, cuda.blockIdx.x)


@cuda.jit
def _add_rms_norm_kernel(hidden, delta, weight, eps, out):
    t = cuda.blockIdx.x
    for i in range(cuda.threadIdx.x, hidden.shape[1], THREADS):
        hidden[t, i] += widen(delta[t, i])
    cuda.syncthreads()
    _normalize_row(hidden, weight, eps, out, t)


@cuda.jit
def _rotary_write_kernel(query, key, qkv, cos, sin, k_cache, v_cache, slots):
    t = cuda.blockIdx.x
    num_heads, num_kv_heads, head_size = query.shape[1], key.shape[1], query.shape[2]
    half = head_size // 2
    values = (num_heads + num_kv_heads) * head_size
    slot = slots[t]
    block_size = k_cache.shape[1]
    for item in range(cuda.threadIdx.x, (num_heads + num_kv_heads) * half, THREADS):
        head, d = item // half, item % half
        start = head * head_size
        first, second = widen(qkv[t, start + d]), widen(qkv[t, start + half + d])
        low = rounded(query, rounded(query, first * widen(cos[t, d])) + rounded(query, -second * widen(sin[t, d])))
        high = rounded(
            query, rounded(query, second * widen(cos[t, half + d])) + rounded(query, first * widen(sin[t, half + d]))
        )
        if head < num_heads:
            query[t, head, d] = narrow(query, low)
            query[t, head, half + d] = narrow(query, high)
        else:
            kv_head = head - num_heads
            key[t, kv_head, d] = narrow(key, low)
            key[t, kv_head, half + d] = narrow(key, high)
            if slot >= 0:
                block, offset = slot // block_size, slot % block_size
                k_cache[block, offset, kv_head, d] = narrow(k_cache, low)
                k_cache[block, offset, kv_head, half + d] = narrow(k_cache, high)
                source = values + kv_head * head_size
                v_cache[block, offset, kv_head, d] = narrow(v_cache, widen(qkv[t, source + d]))
                v_cache[block, offset, kv_head, half + d] = narrow(v_cache, widen(qkv[t, source + half + d]))


@cuda.jit
def _swiglu_kernel(gate_up, out):
    t, size = cuda.blockIdx.y, out.shape[1]
    i = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
    if i < size:
        gate = widen(gate_up[t, i])
        silu = gate / (float32(1.0) + math.exp(-gate)) if gate > SILU_ZERO_BELOW else float32(0.0)
        out[t, i] = narrow(out, rounded(out, silu) * widen(gate_up[t, size + i]))


def rms_norm(hidden, weight, eps: float, out, delta=None) -> None:
    """``hidden += delta`` (``delta`` in the activations' dtype; skipped when None), then ``out`` =
    RMSNorm of ``hidden`` (float32 ``[T, H]``) with ``weight`` (float32 ``[H]``)."""
    rows = hidden.shape[0]
    if rows == 0:
        return
    launch = LaunchContext(hidden, weight, out, *(() if delta is None else (delta,)))
    if delta is None:
        arrays = [device_array(a) for a in (hidden, weight)]
        configured(_rms_norm_kernel, rows, THREADS, launch.stream)(*arrays, np.float32(eps), device_array(out))
    else:
        arrays = [device_array(a) for a in (hidden, delta, weight)]
        configured(_add_rms_norm_kernel, rows, THREADS, launch.stream)(*arrays, np.float32(eps), device_array(out))


def rotary_write(query, key, qkv, cos, sin, k_cache, v_cache, slots) -> None:
    """Any tokens (prefill chunks, decodes): ``qkv`` ``[T, (heads + 2 * kv_heads) * head_size]`` with
    ``cos``/``sin`` ``[T, head_size]``; writes the rotated queries to ``query`` ``[T, heads,
    head_size]``, the rotated keys to ``key`` ``[T, kv_heads, head_size]`` and to ``slots[t]`` of
    ``k_cache``, and the values to ``slots[t]`` of ``v_cache`` (a negative slot is skipped)."""
    rows = qkv.shape[0]
    if rows == 0:
        return
    arguments = (query, key, qkv, cos, sin, k_cache, v_cache, slots)
    launch = LaunchContext(*arguments)
    configured(_rotary_write_kernel, rows, THREADS, launch.stream)(*(device_array(a) for a in arguments))


def swiglu(gate_up, out) -> None:
    """``out`` ``[T, I]`` = ``silu(gate) * up`` for ``gate_up`` ``[T, 2 * I]`` (the gate's columns, then
    the up projection's), rounded as torch's ``F.silu(gate) * up`` rounds: the SiLU to the
    activations' dtype, then the product."""
    rows, size = out.shape
    if rows == 0:
        return
    launch = LaunchContext(gate_up, out)
    configured(_swiglu_kernel, (-(-size // THREADS), rows), THREADS, launch.stream)(
        device_array(gate_up), device_array(out)
    )
