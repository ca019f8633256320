"""The ``numba-cuda`` executor for hetero-infer."""

from hetero_executor_numba.executor import NumbaCudaExecutor

__all__ = ["NumbaCudaExecutor"]
