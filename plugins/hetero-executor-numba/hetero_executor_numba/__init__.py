"""The ``numba-cuda`` attention backend for the ``torch`` executor, and the ``numba-cuda`` executor preset.

``NumbaCudaAttention`` imports Numba, so it loads on first use.
"""

from __future__ import annotations

from typing import Any

from hetero_executor_numba.plugin import numba_cuda_executor

__all__ = ["NumbaCudaAttention", "numba_cuda_executor"]


def __getattr__(name: str) -> Any:
    if name == "NumbaCudaAttention":
        from hetero_executor_numba.attention import NumbaCudaAttention

        return NumbaCudaAttention
    raise AttributeError(f"module 'hetero_executor_numba' has no attribute {name!r}")
