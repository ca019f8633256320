"""Decode-only steps on the CPU through ``hetero_kernels.cpu_decode``: each stretch between two matmuls one Numba call.

The ``numba`` attention backend brings them. A decode step computes the
same function as :meth:`LlamaModel.hidden_states
<hetero_executor_torch.model.LlamaModel.hidden_states>`, op for op in the
same roundings (the reductions reassociated), with three kernel calls per
layer where the torch ops were about twenty: at batch 1 their dispatch
costs more than their arithmetic (figures in ``benchmarks/README.md``).
Steps with prefill chunks take the torch ops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from hetero_executor_torch.attention import AttentionInputs

if TYPE_CHECKING:
    from hetero_executor_torch.model import LlamaModel

DTYPES = (torch.float32, torch.bfloat16)


def serves(dtype: torch.dtype, kv_cache_dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the fused kernels run a model in ``dtype`` with a cache in ``kv_cache_dtype`` on ``device``."""
    return device.type == "cpu" and dtype in DTYPES and kv_cache_dtype == dtype


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor as the kernels take it: a zero-copy numpy array, bfloat16 as its raw ``uint16`` bits."""
    return (tensor.view(torch.uint16) if tensor.dtype == torch.bfloat16 else tensor).numpy()


class FusedDecode:
    """Runs a decode-only step's layers for ``model``."""

    def __init__(self, model: LlamaModel) -> None:
        from hetero_kernels import cpu_decode

        self.kernels = cpu_decode
        self.model = model
        self.eps = np.float32(model.config.rms_norm_eps)
        self.input_norms = [layer.input_norm.numpy() for layer in model.layers]
        self.post_norms = [layer.post_norm.numpy() for layer in model.layers]
        self._caches: list[Any] | None = None
        self._arrays: list[tuple[np.ndarray, np.ndarray]] = []

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionInputs, kv_caches: list[Any]) -> torch.Tensor:
        """The residual stream after the last layer, [B, hidden] float32, for one decode token per sequence."""
        model, kernels, config = self.model, self.kernels, self.model.config
        rows, dtype = input_ids.shape[0], model.dtype
        cos, sin = (_array(table.view(rows, -1)) for table in model.rope_tables(positions))
        meta = attention.kernel
        tables = (attention.slot_mapping.numpy(), meta.decode_tables.numpy(), meta.decode_lens.numpy())
        hidden = model.embedding.embed(input_ids).float()
        stream = hidden.numpy()
        # each layer's inputs to its matmuls, overwritten layer after layer
        x = torch.empty(rows, config.hidden_size, dtype=dtype)
        attended = torch.empty(rows, config.num_heads, config.head_size, dtype=dtype)
        x_out, attended_out = _array(x), _array(attended)
        kernels.rms_norm(stream, self.input_norms[0], self.eps, x_out)
        last = len(model.layers) - 1
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(model.layers, self._cache_arrays(kv_caches))):
            kernels.rotary_decode_attention(attended_out, _array(layer.qkv(x)), cos, sin, k_cache, v_cache, *tables, config.num_heads, model.scale)
            kernels.add_rms_norm(stream, _array(layer.o_proj(attended.view(rows, -1))), self.post_norms[i], self.eps, x_out)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            down = layer.down(F.silu(gate) * up)
            if i == last:
                hidden += down
            else:
                kernels.add_rms_norm(stream, _array(down), self.input_norms[i + 1], self.eps, x_out)
        return hidden

    def _cache_arrays(self, kv_caches: list[Any]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The layers' caches as arrays, made again only when the executor hands over other caches
        (holding the list keeps its tensors, and so the arrays' memory, alive)."""
        if kv_caches is not self._caches:
            self._caches = kv_caches
            self._arrays = [(_array(k), _array(v)) for k, v in kv_caches]
        return self._arrays
