"""Registers the ``numba-cuda`` executor, with its options."""

from __future__ import annotations

import attrs

from hetero_core.hookspecs import Register, hookimpl
from hetero_executor_numba.executor import NumbaCudaExecutor
from hetero_executor_torch.plugin import TorchExecutorOptions

# The torch executor's options but ``attention``: here it is always the Numba CUDA kernels.
NumbaCudaExecutorOptions = attrs.make_class(
    "NumbaCudaExecutorOptions",
    {
        f.name: attrs.field(default=f.default, validator=f.validator, type=f.type)
        for f in attrs.fields(TorchExecutorOptions)
        if f.name != "attention"
    },
    frozen=True,
)


@hookimpl
def register_executors(register: Register) -> None:
    register("numba-cuda", NumbaCudaExecutor, options=NumbaCudaExecutorOptions)
