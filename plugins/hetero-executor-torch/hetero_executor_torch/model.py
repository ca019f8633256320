"""A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a paged KV cache."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Protocol

import attrs
import torch
import torch.nn.functional as F

from hetero_core.errors import ConfigError
from hetero_executor_torch.attention import AttentionInputs, paged_attention, write_kv
from hetero_executor_torch.loading import Loaders
from hetero_executor_torch.model_config import ModelConfig
from hetero_executor_torch.quantized import PACKED_MAX_ROWS, Linear, PackedLinear, Weight, concat, make_linear

BUILD_THREADS = 4  # the most layers built at once: each holds its intermediates (hundreds of MB at 3B)


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    half = config.head_size // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, half, dtype=torch.float64) / half))
    if config.rope_frequency_factors is not None:  # GGUF's rope_freqs, as llama.cpp applies them
        return (inv_freq / torch.tensor(config.rope_frequency_factors, dtype=torch.float64)).float()
    scaling = config.rope_scaling or {"rope_type": "default"}
    if scaling["rope_type"] == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif scaling["rope_type"] == "llama3":  # Llama 3.1's frequency-dependent scaling
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        original = scaling.get("original_max_position_embeddings", 8192)
        wavelength = 2 * math.pi / inv_freq
        smooth = (original / wavelength - low) / (high - low)
        scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
        middle = (wavelength <= original / low) & (wavelength >= original / high)
        inv_freq = torch.where(middle, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    return inv_freq.float()


class Layer:
    """One decoder layer's weights (q/k/v and gate/up fused for fewer, larger matmuls)."""

    def __init__(
        self,
        weights: Loaders,
        prefix: str,
        config: ModelConfig,
        linear: Callable[[list[Weight], torch.Tensor | None], Linear],
    ) -> None:
        def take(name: str) -> Weight:
            return weights.pop(f"{prefix}.{name}")()

        self.input_norm = take("input_layernorm.weight")
        self.post_norm = take("post_attention_layernorm.weight")
        self.head_norms = (
            (take("self_attn.q_norm.weight"), take("self_attn.k_norm.weight")) if config.head_norm else None
        )
        qkv_bias = (
            torch.cat([take("self_attn.q_proj.bias"), take("self_attn.k_proj.bias"), take("self_attn.v_proj.bias")])
            if config.attention_bias
            else None
        )
        self.qkv = linear(
            [take("self_attn.q_proj.weight"), take("self_attn.k_proj.weight"), take("self_attn.v_proj.weight")],
            qkv_bias,
        )
        self.o_proj = linear([take("self_attn.o_proj.weight")], None)
        self.gate_up = linear([take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")], None)
        self.down = linear([take("mlp.down_proj.weight")], None)

    @property
    def linears(self) -> tuple[Linear, Linear, Linear, Linear]:
        """The layer's projections in the order it runs them: q|k|v, o, gate|up, down."""
        return (self.qkv, self.o_proj, self.gate_up, self.down)


class LayerStack(Protocol):
    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionInputs,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor: ...


@attrs.define
class ModelWeights:
    """Every weight of the model, as the layers hold them (what :mod:`~hetero_executor_torch.weight_cache` stores)."""

    embedding: Linear
    lm_head: Linear
    norm: torch.Tensor
    layers: list[Layer]


def build_weights(
    config: ModelConfig,
    weights: Loaders,
    dtype: torch.dtype,
    device: torch.device,
    weight_format: str = "dense",
    dense_copy: bool = False,
) -> ModelWeights:
    """Read each weight once and hold it in ``weight_format``
    (see :func:`~hetero_executor_torch.quantized.make_linear`). The layers are built on as many threads
    as torch uses, up to :data:`BUILD_THREADS`: repacking a file's blocks is numpy work, which runs
    outside the interpreter's lock."""
    weights = dict(weights)  # taken as the layers are built
    # auto keeps what the file holds exactly (a Q8_0 embedding / head whole, or as two int4 halves); int4 and int8
    # hold the embedding / head per-row int8 (groups of 4 bits cost too much agreement there)
    table_format = "int8" if weight_format in ("int8", "int4") else weight_format

    def linear(parts: list[Weight], bias: torch.Tensor | None, fmt: str = weight_format, table: bool = False) -> Linear:
        bias = None if bias is None else bias.to(device=device, dtype=dtype)
        return make_linear(concat(parts), bias, fmt, dtype, device, table, dense_copy)

    try:
        embed = weights.pop("model.embed_tokens.weight")()
        norm = weights.pop("model.norm.weight")().to(device=device, dtype=torch.float32)
        head = weights.pop("lm_head.weight", lambda: None)()
        tied = config.tie_word_embeddings or head is None
        lm_head = linear([embed if tied else head], None, table_format, table=tied)
        embedding = lm_head if tied else linear([embed], None, table_format, table=True)
        inference = torch.is_inference_mode_enabled()

        def build_layer(i: int) -> Layer:
            with torch.inference_mode(inference):  # the caller's mode, on the worker's thread
                return Layer(weights, f"model.layers.{i}", config, linear)

        with ThreadPoolExecutor(max_workers=min(BUILD_THREADS, torch.get_num_threads())) as pool:
            layers = list(pool.map(build_layer, range(config.num_layers)))
    except KeyError as exc:
        raise ConfigError(f"model {config.name!r} lacks the weight {exc.args[0]}", param="model") from exc
    for layer in layers:
        layer.input_norm = layer.input_norm.to(device=device, dtype=torch.float32)
        layer.post_norm = layer.post_norm.to(device=device, dtype=torch.float32)
        if layer.head_norms is not None:
            layer.head_norms = tuple(norm.to(device=device, dtype=torch.float32) for norm in layer.head_norms)
    return ModelWeights(embedding, lm_head, norm, layers)


class LlamaModel:
    """Weights plus a forward pass over a flattened batch of prefill chunks and decodes."""

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        dtype: torch.dtype,
        device: torch.device,
        attention: Callable[..., torch.Tensor] = paged_attention,
        weight_format: str = "dense",
    ) -> None:
        self.config = config
        self.attention = attention
        self.dtype = dtype
        self.device = device
        self.weight_format = weight_format
        self.embedding, self.lm_head, self.norm, self.layers = (
            weights.embedding,
            weights.lm_head,
            weights.norm,
            weights.layers,
        )
        self.q_size = config.num_heads * config.head_size
        self.kv_size = config.num_kv_heads * config.head_size
        self.scale = config.head_size**-0.5
        self.inv_freq = rope_inverse_frequencies(config).to(device)
        # a faster strategy for the same function (fused_layers.FusedLayers), set by whoever runs the model
        self.fused: LayerStack | None = None

    def rope_tables(
        self, positions: torch.Tensor, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for each token, [T, 1, head_size], in ``dtype`` (the compute dtype by default)."""
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)[:, None, :]
        return angles.cos().to(dtype or self.dtype), angles.sin().to(dtype or self.dtype)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Normalized in float32 (the residual stream's dtype), returned in the compute dtype."""
        return F.rms_norm(x, (x.shape[-1],), weight, self.config.rms_norm_eps).to(self.dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE with transformers' own roundings in bf16 (a fused ``addcmul`` form, a little
        faster, rounded differently and lost top-1 agreement with float32 in ``benchmarks/quality.py``)."""
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionInputs,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (float32, [len(logits_indices), vocab]) for the tokens at ``logits_indices``."""
        return self.logits_at(self.hidden_states(input_ids, positions, attention, kv_caches), logits_indices)

    def packed_rows(self) -> int:
        """The most rows every packed layer multiplies on its packed kernel
        (:data:`~hetero_executor_torch.quantized.PACKED_MAX_ROWS` where none is packed)."""
        return min((linear.max_rows for linear in self._packed()), default=PACKED_MAX_ROWS)

    def unwidened_rows(self) -> int:
        """The most rows every packed layer multiplies without widening its weights (on its packed kernel, or
        on the AMX kernel), :data:`~hetero_executor_torch.quantized.PACKED_MAX_ROWS` where none is packed."""
        return min((linear.unwidened_rows() for linear in self._packed()), default=PACKED_MAX_ROWS)

    def _packed(self) -> list[PackedLinear]:
        linears = (linear for layer in self.layers for linear in layer.linears)
        return [linear for linear in linears if isinstance(linear, PackedLinear)]

    def logits_at(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """Float32 logits of the residual stream's rows at ``indices`` (through the last norm and the head)."""
        return self.logits(self.rms_norm(hidden[indices], self.norm))

    def logits(self, normed_hidden: torch.Tensor) -> torch.Tensor:
        """The head's float32 logits for final hidden states that have been through the last norm."""
        return self.lm_head(normed_hidden).float()

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionInputs,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """The residual stream after the last layer, [T, hidden] in float32, before the final norm.

        The stream and the norms stay in float32 whatever the compute dtype: with
        the GGUF's packed weights in bf16 that lifts top-1 agreement with the
        float32 model to transformers bf16's (``benchmarks/quality.py``; figures
        in ``docs/design/2026-11-26-cpu-fused-layers.md``, "Choices").

        This is the reference; with ``fused`` set, the same function runs through
        it instead (:mod:`hetero_executor_torch.fused_layers`' CPU kernels).
        """
        if self.fused is not None:
            return self.fused.hidden_states(input_ids, positions, attention, kv_caches)
        config = self.config
        cos, sin = self.rope_tables(positions)
        hidden = self.embedding.embed(input_ids).float()
        num_tokens = hidden.shape[0]
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x = self.rms_norm(hidden, layer.input_norm)
            qkv = layer.qkv(x)
            # q and k heads side by side, rotated in one go
            qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, -1, config.head_size)
            if layer.head_norms is not None:
                q_norm, k_norm = layer.head_norms
                qk = torch.cat(
                    [
                        self.rms_norm(qk[:, : config.num_heads], q_norm),
                        self.rms_norm(qk[:, config.num_heads :], k_norm),
                    ],
                    dim=1,
                )
            qk = self.rotate(qk, cos, sin)
            q, k = qk[:, : config.num_heads], qk[:, config.num_heads :]
            v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, config.num_kv_heads, config.head_size)
            write_kv(k_cache, v_cache, k, v, attention.slot_mapping)
            attended = self.attention(q, k, v, k_cache, v_cache, attention, self.scale)
            hidden = hidden + layer.o_proj(attended.reshape(num_tokens, self.q_size))
            x = self.rms_norm(hidden, layer.post_norm)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            hidden = hidden + layer.down(F.silu(gate) * up)
        return hidden
