"""The ``numba-cuda`` executor and attention backend for hetero-infer."""

from hetero_executor_numba.attention import NumbaCudaAttention
from hetero_executor_numba.executor import numba_cuda_executor

__all__ = ["NumbaCudaAttention", "numba_cuda_executor"]
