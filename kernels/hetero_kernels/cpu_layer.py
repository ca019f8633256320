"""A Llama-family decoder layer for a decode step with packed int4 weights, in one Numba call.

With every projection on :mod:`hetero_kernels.cpu_packed_vnni`'s matmul
and the rest on :mod:`hetero_kernels.cpu_fused`, a layer is eight kernel
calls; made from Python, their dispatch and the tensors passed between them
cost about as much as a small projection. Here Numba calls them: one
dispatch per layer, every intermediate in buffers the caller allocates once
per step. The arithmetic is the same kernels', call for call.
"""

from __future__ import annotations

from numba import njit

from hetero_kernels.cpu_fused import normalize_rows, rotary_decode_planned, swiglu
from hetero_kernels.cpu_packed_vnni import matmul


@njit(cache=True)
def decode_layer(stream, x, buffers, weights, post_norm, next_norm, eps, attention):
    """One layer for one decode token per sequence.

    ``stream`` (float32 ``[B, H]``) is the residual stream and ``x`` its RMSNorm, the layer's input (in
    the activations' dtype); on return they hold the stream after the layer and its RMSNorm with
    ``next_norm`` (the next layer's input norm, or the model's final one). ``buffers`` are the layer's
    intermediates ``(qkv, attended, projected, gate_up, mlp)``, ``weights`` the four projections
    packed by :func:`hetero_kernels.cpu_packed.pack4` or ``pack8`` (each its own), each ``(bytes,
    factors)``: q/k/v, output, gate/up, down. ``attention`` is
    :func:`hetero_kernels.cpu_fused.rotary_decode_attention`'s arguments past ``out`` and ``qkv``,
    with its :func:`~hetero_kernels.cpu_fused.decode_plan`."""
    qkv, attended, projected, gate_up, mlp = buffers
    (qkv_bytes, qkv_factors), (o_bytes, o_factors), (gate_up_bytes, gate_up_factors), (down_bytes, down_factors) = (
        weights
    )
    matmul(x, qkv_bytes, qkv_factors, qkv)
    rotary_decode_planned(attended, qkv, *attention)
    matmul(attended.reshape(x.shape[0], -1), o_bytes, o_factors, projected)
    normalize_rows(stream, projected, post_norm, eps, x)
    matmul(x, gate_up_bytes, gate_up_factors, gate_up)
    swiglu(gate_up, mlp)
    matmul(mlp, down_bytes, down_factors, projected)
    normalize_rows(stream, projected, next_norm, eps, x)
