"""The torch executor's model with attention served by the Numba CUDA paged-attention kernels.

Everything but attention (projections, norms, MLP, sampling, the paged KV
cache tensors) is the ``torch`` executor's; attention runs
``hetero_kernels.cuda`` directly on the torch CUDA tensors, on torch's
stream, reading keys and values through the block tables with no gather and
no host round trip. Without a GPU, ``NUMBA_ENABLE_CUDASIM=1`` runs the same
kernels on Numba's CUDA simulator over CPU tensors (slow; for tests).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from numba import config as numba_config

from hetero_core.errors import ConfigError
from hetero_executor_torch import TorchExecutor
from hetero_executor_torch.executor import resolve_device
from hetero_executor_torch.kernel_attention import kernel_attention


def simulator_enabled() -> bool:
    return bool(numba_config.ENABLE_CUDASIM)


class NumbaCudaExecutor(TorchExecutor):
    """Options as the ``torch`` executor's (``dtype``, ``kv_cache_dtype``, ``device``, ``num_threads``,
    ``decode_graphs``: the kernels launch on torch's stream, so a CUDA graph records them with the rest).

    ``dtype`` auto is float16 here: the kernels read float16 or float32 caches
    (numba has no bfloat16), accumulating in float32.
    """

    def __init__(
        self,
        config: Any,
        dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        device: str = "auto",
        num_threads: int | None = None,
        decode_graphs: bool | str = "auto",
    ) -> None:
        super().__init__(
            config,
            dtype=self._dtype(dtype),
            kv_cache_dtype=kv_cache_dtype,
            device=device,
            num_threads=num_threads,
            attention="numba",
            decode_graphs=decode_graphs,
        )
        if self.kv_cache_dtype == torch.bfloat16:
            raise ConfigError("the Numba CUDA kernels read float16 or float32 KV caches, not bfloat16", param="kv_cache_dtype")

    @staticmethod
    def _dtype(dtype: str) -> str:
        if dtype != "auto":
            return dtype
        return "float32" if simulator_enabled() or not torch.cuda.is_available() else "float16"

    def _device(self, device: str) -> torch.device:
        if simulator_enabled():
            return torch.device("cpu")  # the simulator runs the kernels on host memory
        if not torch.cuda.is_available():
            raise ConfigError(
                "executor 'numba-cuda' needs a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1 to run its kernels on the simulator);"
                " use executor 'torch' on the CPU",
                param="executor",
            )
        resolved = resolve_device("cuda" if device == "auto" else device)
        if resolved.type != "cuda":
            raise ConfigError(f"executor 'numba-cuda' runs on CUDA devices, not {device!r}", param="device")
        return resolved

    def _attention_function(self) -> Callable[..., torch.Tensor]:
        from hetero_kernels import cuda

        return kernel_attention(cuda)
