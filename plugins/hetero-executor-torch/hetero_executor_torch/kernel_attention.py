"""Attention backends served by the ``hetero_kernels`` paged-attention kernels instead of torch ops.

The kernels read keys and values straight from the paged cache through the
block tables (no gather). On the CPU they are the Numba CPU kernels over
zero-copy numpy views of the torch tensors; on CUDA the Numba CUDA kernels
take the torch tensors themselves and run on torch's stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hetero_core.errors import ConfigError
from hetero_core.step_layout import StepLayout
from hetero_executor_torch.attention import AttentionInputs, KernelInputs


def kernel_array(tensor: torch.Tensor) -> Any:
    """What the kernels take: a CPU tensor as a zero-copy numpy array (bfloat16 as its raw bits, the
    ``uint16`` the CPU kernels read as bfloat16), a CUDA tensor as it is."""
    if tensor.device.type != "cpu":
        return tensor
    return (tensor.view(torch.uint16) if tensor.dtype == torch.bfloat16 else tensor).numpy()


class KernelAttention:
    """An attention backend running ``kernels`` (a module with ``paged_decode_attention`` and
    ``paged_prefill_attention``, as ``hetero_kernels.cpu`` and ``hetero_kernels.cuda``).

    Subclasses name the backend and check where it runs in :meth:`configure`.
    """

    name = "kernels"
    supports_graphs = True
    fused_kernels: str | None = None  # the hetero_kernels module that runs the layers' other ops beside these kernels

    def __init__(self, kernels: Any) -> None:
        self.kernels = kernels

    def configure(self, device: torch.device, kv_cache_dtype: torch.dtype) -> torch.dtype:
        return kv_cache_dtype

    def inputs(self, step: StepLayout, slot_mapping: torch.Tensor) -> AttentionInputs:
        return AttentionInputs(slot_mapping, step.num_decodes, [], [], kernel_inputs(step, slot_mapping.device))

    def graph_inputs(self, slot_mapping, block_tables, context_lens, block_size: int) -> AttentionInputs:
        device, rows = block_tables.device, block_tables.shape[0]
        no_prefills = KernelInputs(
            block_tables,
            context_lens,
            torch.zeros(0, 1, dtype=torch.int32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device),
            torch.zeros(0, dtype=torch.int32, device=device),
        )
        return AttentionInputs(slot_mapping, rows, [], [], no_prefills)

    def attend(self, query, key, value, k_cache, v_cache, inputs: AttentionInputs, scale: float) -> torch.Tensor:
        kernels, meta = self.kernels, inputs.kernel
        out = torch.empty_like(query)
        n = inputs.num_decodes
        caches = (kernel_array(k_cache), kernel_array(v_cache))
        if n:
            q, part = query[:n], out[:n]
            q, target = self.operands(q, part)
            kernels.paged_decode_attention(
                kernel_array(target),
                kernel_array(q),
                *caches,
                kernel_array(meta.decode_tables),
                kernel_array(meta.decode_lens),
                scale,
            )
            if target is not part:
                part.copy_(target)
        if query.shape[0] > n:
            q, part = query[n:], out[n:]
            q, target = self.operands(q, part)
            kernels.paged_prefill_attention(
                kernel_array(target),
                kernel_array(q),
                *caches,
                kernel_array(meta.prefill_tables),
                kernel_array(meta.prefill_query_start),
                kernel_array(meta.prefill_context_lens),
                scale,
            )
            if target is not part:
                part.copy_(target)
        return out

    def operands(self, query: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The queries as the kernels take them, and where they write (``out`` itself, or a buffer
        copied into it after the call): here a contiguous float32 copy of the queries and a float32
        buffer, as the CPU kernels take them."""
        q = query.float().contiguous()
        return q, torch.empty_like(q)


class NumbaCpuAttention(KernelAttention):
    """The ``numba`` backend: the Numba CPU kernels, reading the paged cache (float32, bfloat16 or
    float16) in place. CPU only."""

    name = "numba"
    fused_kernels = "cpu_fused"

    def __init__(self) -> None:
        from hetero_kernels import cpu

        super().__init__(cpu)

    def configure(self, device: torch.device, kv_cache_dtype: torch.dtype) -> torch.dtype:
        if device.type != "cpu":
            raise ConfigError(
                f"attention 'numba' runs the Numba CPU kernels, not on {device}; on CUDA use executor 'numba-cuda'",
                param="attention",
            )
        return kv_cache_dtype


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
