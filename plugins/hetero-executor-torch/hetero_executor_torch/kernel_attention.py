"""Attention served by the ``hetero_kernels`` paged-attention kernels instead of torch ops.

The kernels read keys and values straight from the paged cache through the
block tables (no gather). On the CPU they are the Numba CPU kernels over
zero-copy numpy views of the torch tensors; on CUDA the Numba CUDA kernels
take the torch tensors themselves and run on torch's stream.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from hetero_core.step_layout import StepLayout
from hetero_executor_torch.attention import AttentionInputs, KernelInputs, prefill_attention

AttentionFunction = Callable[..., torch.Tensor]


def _view(tensor: torch.Tensor) -> Any:
    return tensor.numpy() if tensor.device.type == "cpu" else tensor


def kernel_attention(kernels: Any, *, torch_prefill: bool = False) -> AttentionFunction:
    """An attention function with :func:`paged_attention`'s signature, running ``kernels``.

    With ``torch_prefill``, prefill chunks take the torch path and only decodes
    run the kernel (the CPU kernel is a scalar loop: fast for one query token,
    slow for a long chunk).
    """

    def attend(query, key, value, k_cache, v_cache, inputs: AttentionInputs, scale: float) -> torch.Tensor:
        meta = inputs.kernel
        q = query.float().contiguous()
        out = torch.empty_like(q)
        n = inputs.num_decodes
        caches = (_view(k_cache), _view(v_cache))
        if n:
            kernels.paged_decode_attention(_view(out[:n]), _view(q[:n]), *caches, _view(meta.decode_tables), _view(meta.decode_lens), scale)
        if q.shape[0] > n and torch_prefill:
            prefill_attention(out, q, key.float(), value.float(), k_cache, v_cache, inputs, scale)
        elif q.shape[0] > n:
            kernels.paged_prefill_attention(
                _view(out[n:]),
                _view(q[n:]),
                *caches,
                _view(meta.prefill_tables),
                _view(meta.prefill_query_start),
                _view(meta.prefill_context_lens),
                scale,
            )
        return out.to(query.dtype)

    return attend


def kernel_inputs(step: StepLayout, device: torch.device) -> KernelInputs:
    """The step's block tables and lengths as int32 tensors on ``device``."""
    n, num_seqs = step.num_decodes, len(step.sequences)
    arrays = (
        step.block_tables(0, n),
        step.context_lens[:n],
        step.block_tables(n, num_seqs),
        step.query_start[n:] - step.query_start[n],
        step.context_lens[n:],
    )
    return KernelInputs(*(torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device) for a in arrays))
