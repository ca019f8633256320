"""Registers the ``numba-cuda`` executor."""

from hetero_core.hookspecs import Register, hookimpl
from hetero_executor_numba.executor import NumbaCudaExecutor


@hookimpl
def register_executors(register: Register) -> None:
    register("numba-cuda", NumbaCudaExecutor)
