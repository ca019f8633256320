"""The ``numba-cuda`` attention backend for the ``torch`` executor, and the ``numba-cuda`` executor preset."""

from hetero_executor_numba.attention import NumbaCudaAttention
from hetero_executor_numba.plugin import numba_cuda_executor

__all__ = ["NumbaCudaAttention", "numba_cuda_executor"]
