"""The ``numba-cuda`` attention backend: the ``hetero_kernels`` Numba CUDA paged-attention kernels.

The kernels run directly on the torch CUDA tensors, on torch's stream,
reading keys and values through the block tables with no gather and no host
round trip (so a decode graph records them with the rest of the step).
Without a GPU, ``NUMBA_ENABLE_CUDASIM=1`` runs the same kernels on Numba's
CUDA simulator over CPU tensors (slow; for tests).
"""

from __future__ import annotations

import torch
from numba import config as numba_config

from hetero_core.errors import ConfigError
from hetero_executor_torch import KernelAttention


def simulator_enabled() -> bool:
    return bool(numba_config.ENABLE_CUDASIM)


class NumbaCudaAttention(KernelAttention):
    """Decodes and prefill chunks both run the CUDA kernels, on float16, bfloat16 or float32 caches,
    taking the queries and writing the output in the model's dtype (no conversion launches)."""

    name = "numba-cuda"
    fused_kernels = "cuda_fused"

    def __init__(self) -> None:
        from hetero_kernels import cuda

        super().__init__(cuda)

    def configure(self, device: torch.device, kv_cache_dtype: torch.dtype) -> torch.dtype:
        if device.type == "cpu" and not simulator_enabled():
            raise ConfigError(
                "attention 'numba-cuda' runs the Numba CUDA kernels: it needs a CUDA device "
                "(or NUMBA_ENABLE_CUDASIM=1 to run them on the simulator)",
                param="attention",
            )
        if device.type == "cpu":
            return torch.float32  # the simulator computes on host memory in float32/float64
        return kv_cache_dtype

    def operands(self, query: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The queries as they are, the output written in place: the kernels take the model's dtype.
        The simulator copies its arrays, which must then be contiguous; a GPU reads strided views."""
        return (query if query.is_cuda else query.contiguous()), out
