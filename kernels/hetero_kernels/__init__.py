"""Paged attention over a block-paged KV cache, three ways with the same functions.

``reference`` (numpy, float64, the definition), ``cpu`` (Numba, parallel) and
``cuda`` (Numba CUDA) each provide ``write_kv``, ``paged_decode_attention``
and ``paged_prefill_attention`` with the same arguments. The KV cache of a
layer is ``k_cache``/``v_cache`` of shape ``[num_blocks, block_size,
num_kv_heads, head_size]``; position ``p`` of a sequence with block table
``bt`` is at ``[bt[p // block_size], p % block_size]``.

``cpu_fused`` holds the CPU kernels for the rest of a decoder layer's work
between its matmuls (RMSNorm, RoPE with the cache write, a decode's
attention in the same call).

:func:`cpu_variants` says which of the CPU kernels that need particular
instructions run on this host (``HETERO_KERNELS_PORTABLE=1`` turns them
all off, for the portable paths).

``cuda`` is imported on first use: importing ``numba.cuda`` fixes whether the
CUDA simulator is in use (``NUMBA_ENABLE_CUDASIM``), which must stay the
caller's choice.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hetero_kernels import cpu, cpu_fused, reference

__all__ = ["cpu", "cpu_fused", "cpu_variants", "cuda", "reference"]
FEATURE_KERNELS = ("cpu_packed_vnni", "cpu_packed_amx", "cpu_scores")  # the modules with a SUPPORTED flag


def cpu_variants() -> dict[str, bool]:
    """Each CPU kernel module that needs particular instructions, and whether it runs here."""
    return {name: importlib.import_module(f"hetero_kernels.{name}").SUPPORTED for name in FEATURE_KERNELS}


def __getattr__(name: str) -> ModuleType:
    if name == "cuda":
        return importlib.import_module("hetero_kernels.cuda")
    raise AttributeError(f"module 'hetero_kernels' has no attribute {name!r}")
