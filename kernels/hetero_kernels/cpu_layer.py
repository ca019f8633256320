"""A Llama-family decoder layer for a decode step with packed int4 weights, in one Numba call.

With every projection on a packed kernel (:mod:`hetero_kernels.cpu_int4`'s
4-bit or 8-bit matmul for a row or two, :mod:`hetero_kernels.cpu_int4_tiles` for tiles of a few dozen)
and the rest on :mod:`hetero_kernels.cpu_fused`, a layer is eight kernel
calls; made from Python, their dispatch and the tensors passed between them
cost about as much as a small projection. Here Numba calls them: one
dispatch per layer, every intermediate in buffers the caller allocates once
per step. The arithmetic is the same kernels', call for call.
"""

from __future__ import annotations

from numba import njit, types
from numba.extending import overload

from hetero_kernels import cpu_int4, cpu_int4_tiles
from hetero_kernels.cpu_fused import normalize_rows, rotary_decode_planned, swiglu


def _matmul(x, packed, factors, out):
    """``out`` = ``x`` times the weights ``(packed, factors)``, on the kernel that packed them (compiled
    only, see the overload)."""
    raise NotImplementedError


@overload(_matmul)
def _matmul_overload(x, packed, factors, out):
    if packed.ndim == 3:  # cpu_int4_tiles packs [outputs / 16, groups, 256]
        return lambda x, packed, factors, out: cpu_int4_tiles.matmul(x, packed, factors, out)
    if packed.dtype == types.int8:  # cpu_int4.pack8's 8-bit weights
        return lambda x, packed, factors, out: cpu_int4.matmul8(x, packed, factors, out)
    return lambda x, packed, factors, out: cpu_int4.matmul(x, packed, factors, out)


@njit(cache=True)
def decode_layer(stream, x, buffers, weights, post_norm, next_norm, eps, attention):
    """One layer for one decode token per sequence.

    ``stream`` (float32 ``[B, H]``) is the residual stream and ``x`` its RMSNorm, the layer's input (in
    the activations' dtype); on return they hold the stream after the layer and its RMSNorm with
    ``next_norm`` (the next layer's input norm, or the model's final one). ``buffers`` are the layer's
    intermediates ``(qkv, attended, projected, gate_up, mlp)``, ``weights`` the four projections
    packed by :func:`hetero_kernels.cpu_int4.pack` or ``pack8`` (each its own) or by
    :func:`hetero_kernels.cpu_int4_tiles.pack`,
    each ``(bytes, factors)``: q/k/v, output, gate/up, down. ``attention`` is
    :func:`hetero_kernels.cpu_fused.rotary_decode_attention`'s arguments past ``out`` and ``qkv``,
    with its :func:`~hetero_kernels.cpu_fused.decode_plan`."""
    qkv, attended, projected, gate_up, mlp = buffers
    (qkv_bytes, qkv_factors), (o_bytes, o_factors), (gate_up_bytes, gate_up_factors), (down_bytes, down_factors) = (
        weights
    )
    _matmul(x, qkv_bytes, qkv_factors, qkv)
    rotary_decode_planned(attended, qkv, *attention)
    _matmul(attended.reshape(x.shape[0], -1), o_bytes, o_factors, projected)
    normalize_rows(stream, projected, post_norm, eps, x)
    _matmul(x, gate_up_bytes, gate_up_factors, gate_up)
    swiglu(gate_up, mlp)
    _matmul(mlp, down_bytes, down_factors, projected)
    normalize_rows(stream, projected, next_norm, eps, x)
