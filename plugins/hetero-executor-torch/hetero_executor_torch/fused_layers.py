"""The decoder layers in few kernel calls: norms, RoPE and cache writes (and on the CPU a decode's attention) fused.

On the CPU ``hetero_kernels.cpu_fused`` serves them, brought by the
``numba`` attention backend; on CUDA ``hetero_kernels.cuda_fused`` (with any
attention backend, wherever numba-cuda is installed; the ``numba-cuda``
backend brings them on Numba's CUDA simulator too). Every step computes the
same function as :meth:`LlamaModel.hidden_states
<hetero_executor_torch.model.LlamaModel.hidden_states>`, op for op in the
same roundings (the reductions reassociated):

- a CPU decode-only step runs a layer as its four matmuls, two norm calls,
  one call for RoPE, the cache write and attention and one for SwiGLU,
  where the torch ops were about twenty: at batch 1 their dispatch costs
  more than their arithmetic;
- any other step (and every step on CUDA) normalizes (with the residual
  add), rotates and writes the cache, and applies SwiGLU in one kernel each,
  and attends through the backend: on CUDA, where a batch-1 step is hundreds
  of tiny kernels replayed from a graph, that is 8 fewer kernels a layer.

A CPU step whose projections all run on the VNNI kernel
(``hetero_kernels.cpu_packed_vnni``, GGUF's weights on an AVX-512 VNNI CPU),
up to its rows, and whose rows all continue cached sequences (decodes, and the
tokens of steps that verify proposals: each such row attends like a decode,
over its sequence up to its own position) runs each layer as one
``hetero_kernels.cpu_layer`` call, the same kernels called from Numba. This
computes a slightly different, more exact, function: the activations stay
float32 between the kernels, whatever the model's dtype; only the cache keeps
it. That kernel quantizes the activations to 16 bits per group, finer than
bfloat16, so rounding them to bfloat16 first would only add error.

Figures are in ``docs/design/2026-11-26-cpu-fused-layers.md`` ("A decoder layer in
one Numba call") and ``docs/design/2026-11-26-cpu-int4-linear-kernels.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from hetero_executor_torch.attention import AttentionInputs
from hetero_executor_torch.kernel_attention import kernel_array
from hetero_executor_torch.model_config import ModelConfig
from hetero_executor_torch.quantized import Linear, PackedLinear

if TYPE_CHECKING:
    from hetero_executor_torch.model import LlamaModel

DTYPES = (torch.float32, torch.bfloat16)


def fused_kernels(
    attention: object, device: torch.device, dtype: torch.dtype, kv_cache_dtype: torch.dtype, config: ModelConfig
) -> Any:
    """The kernels module that runs the layers fused, or None for torch's ops: none for a model with a
    norm of each query and key head (Qwen3's), which the kernels do not apply; on CUDA ``cuda_fused``
    with any backend, where numba-cuda is installed; elsewhere the module the attention backend names
    in ``fused_kernels`` (``numba``: ``cpu_fused``, for a model in float32 or bf16 with the cache in
    the same dtype; ``numba-cuda`` on its simulator: ``cuda_fused``)."""
    name = "cuda_fused" if device.type == "cuda" else getattr(attention, "fused_kernels", None)
    if config.head_norm or name is None or (name == "cpu_fused" and (dtype not in DTYPES or kv_cache_dtype != dtype)):
        return None
    try:
        return importlib.import_module(f"hetero_kernels.{name}")
    except ImportError:  # hetero_kernels, or numba-cuda, not installed
        return None


def packed_layers(model: LlamaModel) -> list[tuple]:
    """Each layer's four projections as ``hetero_kernels.cpu_layer`` takes them
    (:meth:`PackedLinear.kernel_arrays`); none unless every projection has them."""

    def of(linear: Linear) -> tuple | None:
        return linear.kernel_arrays() if isinstance(linear, PackedLinear) else None

    layers = [tuple(of(linear) for linear in layer.linears) for layer in model.layers]
    return [] if any(four is None for layer in layers for four in layer) else layers


def continuing_rows(attention: AttentionInputs, rows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Per row, the block table and the length of the context it attends to (its own position included),
    when every row continues a cached sequence: decodes, and the tokens of a step that verifies
    proposals (a row sees the rows before it in its sequence); None when a prompt starts in the step."""
    meta = attention.kernel
    n = attention.num_decodes
    if n == rows:
        return meta.decode_tables.numpy(), meta.decode_lens.numpy()
    starts, contexts = meta.prefill_query_start.numpy(), meta.prefill_context_lens.numpy()
    new = np.diff(starts)
    if (contexts <= new).any():
        return None
    decode_tables, chunk_tables = meta.decode_tables.numpy(), meta.prefill_tables.numpy()
    tables = np.zeros((rows, max(decode_tables.shape[1], chunk_tables.shape[1])), dtype=np.int32)
    lengths = np.empty(rows, dtype=np.int32)
    tables[:n, : decode_tables.shape[1]] = decode_tables
    lengths[:n] = meta.decode_lens.numpy()
    for table, start, count, context in zip(chunk_tables, starts[:-1], new, contexts, strict=True):
        chunk = slice(n + start, n + start + count)
        tables[chunk, : table.shape[0]] = table
        lengths[chunk] = np.arange(context - count + 1, context + 1)
    return tables, lengths


class FusedLayers:
    """Runs a step's decoder layers for ``model`` with ``kernels`` (``cpu_fused`` or ``cuda_fused``)."""

    def __init__(self, model: LlamaModel, kernels: Any) -> None:
        self.kernels = kernels
        self.model = model
        self.eps = float(model.config.rms_norm_eps)
        self.input_norms = [kernel_array(layer.input_norm) for layer in model.layers]
        self.post_norms = [kernel_array(layer.post_norm) for layer in model.layers]
        self.final_norm = kernel_array(model.norm)
        # decodes attend inside the kernels that rotate them (the CPU's); else through the backend
        self.decodes_attend = hasattr(kernels, "rotary_decode_attention")
        # the layers as one call each, and the most rows a step may have for them (0: never)
        cpu = model.device.type == "cpu"
        self.packed_layers = packed_layers(model) if cpu else []
        self.packed_rows = model.packed_rows() if self.packed_layers else 0
        if self.packed_layers:
            from hetero_kernels import cpu_layer

            self.layer_kernel = cpu_layer
        self._caches: list[Any] | None = None
        self._arrays: list[tuple[Any, Any]] = []

    def hidden_states(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionInputs, kv_caches: list[Any]
    ) -> torch.Tensor:
        """The residual stream after the last layer, [T, hidden] float32, before the final norm."""
        model, kernels, config = self.model, self.kernels, self.model.config
        rows, dtype, device = input_ids.shape[0], model.dtype, model.device
        hidden = model.embedding.embed(input_ids).float()
        stream = kernel_array(hidden)
        if rows <= self.packed_rows and (continuing := continuing_rows(attention, rows)) is not None:
            self._layers_in_one_call(stream, positions, attention, kv_caches, *continuing)
            return hidden
        cos, sin = (kernel_array(table.view(rows, -1)) for table in model.rope_tables(positions))
        # the inputs of each layer's projections, overwritten layer after layer
        x = torch.empty(rows, config.hidden_size, dtype=dtype, device=device)
        x_out = kernel_array(x)
        kernels.rms_norm(stream, self.input_norms[0], self.eps, x_out)
        mlp = torch.empty(
            rows, config.intermediate_size, dtype=dtype, device=device
        )  # SwiGLU's output, the down projection's input
        mlp_out = kernel_array(mlp)
        attend = (
            self._decodes(attention)
            if self.decodes_attend and attention.num_decodes == rows
            else self._chunks(attention)
        )
        last = len(model.layers) - 1
        for i, (layer, (k_cache, v_cache), caches) in enumerate(
            zip(model.layers, kv_caches, self._cache_arrays(kv_caches), strict=True)
        ):
            attended = attend(layer.qkv(x), cos, sin, k_cache, v_cache, caches)
            kernels.rms_norm(
                stream, self.post_norms[i], self.eps, x_out, kernel_array(layer.o_proj(attended.view(rows, -1)))
            )
            kernels.swiglu(kernel_array(layer.gate_up(x)), mlp_out)
            down = layer.down(mlp)
            if i == last:
                hidden += down
            else:
                kernels.rms_norm(stream, self.input_norms[i + 1], self.eps, x_out, kernel_array(down))
        return hidden

    def _layers_in_one_call(
        self,
        stream: np.ndarray,
        positions: torch.Tensor,
        attention: AttentionInputs,
        kv_caches: list[Any],
        tables: np.ndarray,
        lengths: np.ndarray,
    ) -> None:
        """A step of rows that each continue a cached sequence (:func:`continuing_rows`'s ``tables`` and
        ``lengths``) through ``hetero_kernels.cpu_layer``, one call per layer, leaving the residual stream
        after the last layer in ``stream``.

        The activations stay float32 from layer to layer (only the cache is in the model's dtype): the
        projections quantize them to 16 bits per group anyway, so rounding them to bfloat16 first would
        only add error (``benchmarks/quality.py`` measures the difference)."""
        config, rows = self.model.config, stream.shape[0]
        cos, sin = (kernel_array(table.view(rows, -1)) for table in self.model.rope_tables(positions, torch.float32))
        caches = self._cache_arrays(kv_caches)
        layout = (attention.slot_mapping.numpy(), tables, lengths)
        plan = self.kernels.decode_plan(rows, caches[0][0], keys_first=attention.num_decodes < rows)
        qkv_size = (config.num_heads + 2 * config.num_kv_heads) * config.head_size
        shapes = (
            (qkv_size,),
            (config.num_heads, config.head_size),
            (config.hidden_size,),
            (2 * config.intermediate_size,),
            (config.intermediate_size,),
        )
        buffers = tuple(np.empty((rows, *shape), dtype=np.float32) for shape in shapes)
        x = np.empty((rows, config.hidden_size), dtype=np.float32)
        self.kernels.rms_norm(stream, self.input_norms[0], self.eps, x)
        scale, eps = np.float32(self.model.scale), np.float32(self.eps)
        next_norms = self.input_norms[1:] + [self.final_norm]
        for weights, (k_cache, v_cache), post_norm, next_norm in zip(
            self.packed_layers, caches, self.post_norms, next_norms, strict=True
        ):
            layer_attention = (cos, sin, k_cache, v_cache, *layout, config.num_heads, scale, *plan)
            self.layer_kernel.decode_layer(stream, x, buffers, weights, post_norm, next_norm, eps, layer_attention)

    def _decodes(self, attention: AttentionInputs) -> Callable[..., torch.Tensor]:
        """One decode per sequence: RoPE, the cache write and attention in one kernel call per layer."""
        model, config, meta = self.model, self.model.config, attention.kernel
        tables = (attention.slot_mapping.numpy(), meta.decode_tables.numpy(), meta.decode_lens.numpy())
        attended = torch.empty(attention.num_decodes, config.num_heads, config.head_size, dtype=model.dtype)
        out = kernel_array(attended)

        def attend(qkv, cos, sin, k_cache, v_cache, caches) -> torch.Tensor:
            self.kernels.rotary_decode_attention(
                out, kernel_array(qkv), cos, sin, *caches, *tables, config.num_heads, model.scale
            )
            return attended

        return attend

    def _chunks(self, attention: AttentionInputs) -> Callable[..., torch.Tensor]:
        """Any step: RoPE and the cache write in one kernel call, then the backend's attention."""
        model, config = self.model, self.model.config
        slots = kernel_array(attention.slot_mapping)
        rows = slots.shape[0]
        query = torch.empty(rows, config.num_heads, config.head_size, dtype=model.dtype, device=model.device)
        key = torch.empty(rows, config.num_kv_heads, config.head_size, dtype=model.dtype, device=model.device)
        query_out, key_out = kernel_array(query), kernel_array(key)
        values = slice((config.num_heads + config.num_kv_heads) * config.head_size, None)

        def attend(qkv, cos, sin, k_cache, v_cache, caches) -> torch.Tensor:
            self.kernels.rotary_write(query_out, key_out, kernel_array(qkv), cos, sin, *caches, slots)
            value = qkv[:, values].view(rows, config.num_kv_heads, config.head_size)
            return model.attention(query, key, value, k_cache, v_cache, attention, model.scale)

        return attend

    def _cache_arrays(self, kv_caches: list[Any]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The layers' caches as arrays, made again only when the executor hands over other caches
        (holding the list keeps its tensors, and so the arrays' memory, alive)."""
        if kv_caches is not self._caches:
            self._caches = kv_caches
            self._arrays = [(kernel_array(k), kernel_array(v)) for k, v in kv_caches]
        return self._arrays
