"""Paged attention over a block-paged KV cache: ``reference`` (numpy), ``cpu`` (Numba) and ``cuda`` (Numba CUDA).

Every implementation has the same three functions with the same arguments:
``write_kv``, ``paged_decode_attention`` and ``paged_prefill_attention``.
The KV cache of a layer is ``k_cache``/``v_cache`` of shape
``[num_blocks, block_size, num_kv_heads, head_size]``; position ``p`` of a
sequence with block table ``bt`` is at ``[bt[p // block_size], p % block_size]``.
``hetero_kernels.cuda`` is imported on demand (it needs numba-cuda).
"""

from hetero_kernels import cpu, reference

__all__ = ["cpu", "reference"]
