"""Registers the ``numba-cuda`` executor, with its options."""

from __future__ import annotations

import attrs

from hetero_core.hookspecs import Register, hookimpl
from hetero_executor_numba.executor import numba_cuda_executor
from hetero_executor_torch.plugin import TorchExecutorOptions

# The torch executor's options but ``attention`` (always the Numba CUDA kernels here), ``weights``, ``dense_copy`` and
# ``small_batch_kernels`` (the packed weight formats are CPU kernels; on CUDA weights are dense).
NumbaCudaExecutorOptions = attrs.make_class(
    "NumbaCudaExecutorOptions",
    {
        f.name: attrs.field(default=f.default, validator=f.validator, type=f.type)
        for f in attrs.fields(TorchExecutorOptions)
        if f.name not in ("attention", "weights", "dense_copy", "small_batch_kernels")
    },
    frozen=True,
)


@hookimpl
def register_executors(register: Register) -> None:
    register("numba-cuda", numba_cuda_executor, options=NumbaCudaExecutorOptions)
