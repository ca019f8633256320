"""Registers the ``numba-cuda`` attention backend, and the ``numba-cuda`` executor: a preset of the ``torch`` executor.

The preset is ``{"name": "torch", "attention": "numba-cuda"}`` with defaults
for these kernels: ``device`` ``auto`` is the GPU (the CPU under the CUDA
simulator), and ``dtype`` ``auto`` is float32 under the simulator. Every
other option is the ``torch`` executor's, with its meaning.

Numba loads when the backend or the executor is built, not when the plugin registers them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

from hetero_core.errors import ConfigError
from hetero_core.hookspecs import Register, hookimpl
from hetero_executor_torch import TorchExecutor, TorchExecutorOptions, resolve_device

if TYPE_CHECKING:
    from hetero_executor_numba.attention import NumbaCudaAttention

NAME = "numba-cuda"  # the attention backend's name (NumbaCudaAttention.name) and the executor's


@attrs.frozen
class NumbaCudaExecutorOptions(TorchExecutorOptions):
    """The ``torch`` executor's options, ``attention`` this plugin's backend."""

    attention: str = NAME


def numba_cuda_executor(
    config: Any, dtype: str = "auto", device: str = "auto", attention: str = NAME, **options: Any
) -> TorchExecutor:
    """The ``torch`` executor with the ``numba-cuda`` attention backend, on the GPU (see the module's docstring)."""
    from hetero_executor_numba.attention import NumbaCudaAttention, simulator_enabled

    if attention != NAME:
        raise ConfigError(
            f"executor 'numba-cuda' runs attention {NAME!r}, not {attention!r}; "
            "for another backend use executor 'torch'",
            param="attention",
        )
    simulated = simulator_enabled()
    return TorchExecutor(
        config,
        dtype=_dtype(dtype, simulated),
        device=_device(device, simulated),
        attention=NumbaCudaAttention(),
        **options,
    )


def numba_cuda_attention() -> NumbaCudaAttention:
    """The ``numba-cuda`` attention backend."""
    from hetero_executor_numba.attention import NumbaCudaAttention

    return NumbaCudaAttention()


def _dtype(dtype: str, simulated: bool) -> str:
    if dtype == "auto" and (simulated or not torch.cuda.is_available()):
        return "float32"  # the simulator computes on host memory
    return dtype


def _device(device: str, simulated: bool) -> str:
    if simulated:
        return "cpu"  # the simulator runs the kernels on host memory
    if not torch.cuda.is_available():
        raise ConfigError(
            "executor 'numba-cuda' needs a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1 to run its kernels on the simulator); "
            "use executor 'torch' on the CPU",
            param="executor",
        )
    resolved = resolve_device("cuda" if device == "auto" else device)
    if resolved.type != "cuda":
        raise ConfigError(f"executor 'numba-cuda' runs on CUDA devices, not {device!r}", param="device")
    return str(resolved)


@hookimpl
def register_attention_backends(register: Register) -> None:
    register(NAME, numba_cuda_attention)


@hookimpl
def register_executors(register: Register) -> None:
    register(NAME, numba_cuda_executor, options=NumbaCudaExecutorOptions)
