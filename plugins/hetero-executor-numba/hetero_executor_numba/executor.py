"""The ``numba-cuda`` executor: the ``torch`` executor with the ``numba-cuda`` attention backend.

Everything but attention (projections, norms, MLP, sampling, the paged KV
cache tensors) is the ``torch`` executor's; attention runs
:class:`~hetero_executor_numba.attention.NumbaCudaAttention`. This module
only picks the device and the default dtype for those kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from hetero_core.errors import ConfigError
from hetero_executor_numba.attention import NumbaCudaAttention, simulator_enabled
from hetero_executor_torch import TorchExecutor
from hetero_executor_torch.executor import resolve_device


def numba_cuda_executor(
    config: Any,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    device: str = "auto",
    num_threads: int | None = None,
    decode_graphs: bool | str = "auto",
) -> TorchExecutor:
    """Options as the ``torch`` executor's (``dtype``, ``kv_cache_dtype``, ``device``, ``num_threads``,
    ``decode_graphs``: the kernels launch on torch's stream, so a CUDA graph records them with the rest).

    ``dtype`` auto is the torch executor's on CUDA (float16 for a GGUF, bfloat16 for
    a checkpoint folder); the kernels take float16, bfloat16 and float32,
    accumulating in float32.
    """
    return TorchExecutor(
        config,
        dtype=_dtype(dtype),
        kv_cache_dtype=kv_cache_dtype,
        device=_device(device),
        num_threads=num_threads,
        attention=NumbaCudaAttention(),
        decode_graphs=decode_graphs,
    )


def _dtype(dtype: str) -> str:
    if dtype == "auto" and (simulator_enabled() or not torch.cuda.is_available()):
        return "float32"  # the simulator computes on host memory
    return dtype


def _device(device: str) -> str:
    if simulator_enabled():
        return "cpu"  # the simulator runs the kernels on host memory
    if not torch.cuda.is_available():
        raise ConfigError(
            "executor 'numba-cuda' needs a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1 to run its kernels on the simulator); use executor 'torch' on the CPU",
            param="executor",
        )
    resolved = resolve_device("cuda" if device == "auto" else device)
    if resolved.type != "cuda":
        raise ConfigError(f"executor 'numba-cuda' runs on CUDA devices, not {device!r}", param="device")
    return str(resolved)
