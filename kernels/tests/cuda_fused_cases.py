"""The fused layer kernels (``hetero_kernels.cuda_fused``) against torch's own ops, on a GPU or Numba's CUDA simulator.

Run only through ``test_cuda_simulator.py`` (a subprocess with ``NUMBA_ENABLE_CUDASIM=1``: CPU
tensors, as numpy arrays) and ``test_cuda_device.py`` (where there is a GPU: CUDA tensors). The
reference is what :meth:`LlamaModel.hidden_states` computes with torch on the same device: the residual add
and ``F.rms_norm`` then the conversion, rotate-half RoPE from tables in the activations' dtype,
``index_copy`` into the caches, ``F.silu(gate) * up``. Tiny shapes, 4 threads a block on the simulator (so every loop
strides), float32, float16 and bfloat16 activations. The kernels round where torch rounds; they may
differ by the last bit of a float32 intermediate (a sum's order, ``exp``), which can move a 16-bit
result by one step: the tolerance is one step of the dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numba import config

from hetero_kernels import cuda_fused

SIMULATED = bool(config.ENABLE_CUDASIM)
DEVICE = "cpu" if SIMULATED else "cuda"
if SIMULATED:
    cuda_fused.configure(threads=4)

DTYPES = {torch.float32: 1e-6, torch.float16: 2**-10, torch.bfloat16: 2**-7}  # one step of each, relative
EPS = 1e-5


def raw(tensor: torch.Tensor):
    """What the kernels take: on the simulator a numpy view (bfloat16 as its bits), on a GPU the tensor."""
    if not SIMULATED:
        return tensor
    return (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy()


def close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    np.testing.assert_allclose(got.float().cpu().numpy(), expected.float().cpu().numpy(), rtol=DTYPES[dtype], atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_delta", [False, True], ids=["norm", "add-then-norm"])
def test_rms_norm(dtype: torch.dtype, with_delta: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    hidden = (torch.randn(3, 10, generator=generator) * 4).to(DEVICE)
    delta = torch.randn(3, 10, generator=generator).to(DEVICE, dtype)
    weight = (torch.rand(10, generator=generator) + 0.5).to(DEVICE)
    expected_hidden = hidden + delta if with_delta else hidden.clone()
    expected = F.rms_norm(expected_hidden, (10,), weight, EPS).to(dtype)
    out = torch.empty(3, 10, dtype=dtype, device=DEVICE)
    cuda_fused.rms_norm(raw(hidden), raw(weight), EPS, raw(out), raw(delta) if with_delta else None)
    assert torch.equal(hidden, expected_hidden)  # the add is exact: both sum a float32 and a 16-bit number in float32
    close(out, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rotary_write(dtype: torch.dtype) -> None:
    """Rotated queries and keys, and the keys and values in their cache slots (a negative slot skipped)."""
    heads, kv_heads, head_size, block_size, rows = 4, 2, 6, 3, 4
    generator = torch.Generator().manual_seed(2)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_size, generator=generator).to(DEVICE, dtype)
    angles = (torch.rand(rows, head_size // 2, generator=generator) * 6).to(DEVICE)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    slots = torch.tensor([4, -1, 0, 7], device=DEVICE)
    k_cache = torch.zeros(3, block_size, kv_heads, head_size, dtype=dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)

    qk = qkv[:, : (heads + kv_heads) * head_size].view(rows, -1, head_size)
    half = head_size // 2
    rotated = (
        qk * cos[:, None] + torch.cat([-qk[..., half:], qk[..., :half]], dim=-1) * sin[:, None]
    )  # LlamaModel.rotate
    expected_query, expected_key = rotated[:, :heads], rotated[:, heads:]
    value = qkv[:, (heads + kv_heads) * head_size :].view(rows, kv_heads, head_size)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    kept = slots >= 0
    expected_k.view(-1, kv_heads, head_size).index_copy_(0, slots[kept], expected_key[kept])
    expected_v.view(-1, kv_heads, head_size).index_copy_(0, slots[kept], value[kept])

    query = torch.empty(rows, heads, head_size, dtype=dtype, device=DEVICE)
    key = torch.empty(rows, kv_heads, head_size, dtype=dtype, device=DEVICE)
    cuda_fused.rotary_write(*(raw(t) for t in (query, key, qkv, cos, sin, k_cache, v_cache, slots)))
    close(query, expected_query, dtype)
    close(key, expected_key, dtype)
    close(k_cache, expected_k, dtype)
    assert torch.equal(v_cache, expected_v)  # values are copied as they are


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    gate_up = (torch.randn(2, 14, generator=generator) * 6).to(DEVICE, dtype)
    gate_up[0, 0] = -100.0  # below SiLU's zero
    out = torch.empty(2, 7, dtype=dtype, device=DEVICE)
    cuda_fused.swiglu(raw(gate_up), raw(out))
    gate, up = gate_up.chunk(2, dim=-1)
    close(out, F.silu(gate) * up, dtype)


def test_configure_refuses_a_block_a_gpu_cannot_run() -> None:
    with pytest.raises((ValueError, RuntimeError), match="power of two|before the first kernel launch"):
        cuda_fused.configure(threads=6)
