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


def kernel_inputs(decodes: list, prefills: list, block_size: int, device: torch.device) -> KernelInputs:
    """Block tables and lengths as int32 tensors on ``device``."""

    def table(seqs: list, lengths: list[int]) -> np.ndarray:
        width = max([-(-n // block_size) for n in lengths] + [1])
        rows = np.zeros((len(seqs), width), dtype=np.int32)
        for row, (seq, n) in enumerate(zip(seqs, lengths)):
            blocks = seq.block_table[: -(-n // block_size)]
            rows[row, : len(blocks)] = blocks
        return rows

    decode_lens = [s.start_position + 1 for s in decodes]
    prefill_lens = [s.start_position + len(s.token_ids) for s in prefills]
    starts = np.concatenate([[0], np.cumsum([len(s.token_ids) for s in prefills])]).astype(np.int32)
    arrays = (
        table(decodes, decode_lens),
        np.array(decode_lens, dtype=np.int32),
        table(prefills, prefill_lens),
        starts,
        np.array(prefill_lens, dtype=np.int32),
    )
    return KernelInputs(*(torch.from_numpy(a).to(device) for a in arrays))
