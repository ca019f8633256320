"""Load weights into Hugging Face Llama naming, from a GGUF file or a Hugging Face folder.

GGUF tensors whose type has an exact group form
(:mod:`~hetero_executor_torch.gguf_blocks`: Q4_0, Q4_1, Q4_K as 4-bit
groups, Q5_0, Q5_1, Q5_K, Q8_0, IQ4_NL, Q3_K as 8-bit ones, Q6_K and Q2_K as
8-bit groups of 16) arrive in it when the caller keeps weights quantized;
the rest are dequantized with the ``gguf`` package. A quantized type that
ends up dense (Q8_K; Q6_K and Q2_K without ``hetero_kernels``) is named in a warning with its size. llama.cpp's
converter permutes the rows of the q and k projections so that RoPE rotates
adjacent pairs; :func:`unpermute` undoes that per head, so one forward pass
(rotate-half RoPE, as Hugging Face computes it) serves both sources. RoPE's
scaling comes from ``rope_freqs.weight`` (Llama 3's per-frequency factors) or
``rope.scaling.type`` ``linear``; other scalings are refused.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Callable

import attrs
import gguf
import numpy as np
import torch
from safetensors import safe_open

from hetero_core.errors import ConfigError
from hetero_core.gguf_header import GGUFHeader, TensorInfo, read_gguf_header
from hetero_core.logs import get_logger
from hetero_core.model_source import parse
from hetero_executor_torch.gguf_blocks import group_form
from hetero_executor_torch.model_config import SUPPORTED_GGUF_ARCHITECTURES, ModelConfig, token_ids
from hetero_executor_torch.quantized import ByteQuantized, Codes, GroupQuantized, Weight, fine_groups_run_packed

log = get_logger(__name__)

T = gguf.GGMLQuantizationType
PACKED_TYPES = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.Q3_K, T.Q4_K, T.Q5_K}  # see gguf_blocks
FINE_TYPES = {T.Q2_K, T.Q6_K}  # in groups of 16: packed where fine_groups_run_packed()
DENSE_ONLY_TYPES = {T.Q8_K}  # quantized, but loaded dense (with a warning)
GGUF_TYPES = PACKED_TYPES | FINE_TYPES | DENSE_ONLY_TYPES | {T.F32, T.F16, T.BF16}

GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of q/k rows (pairwise RoPE) back to the rotate-half layout."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


_TYPE_NUMBERS = {kind.value for kind in gguf.GGMLQuantizationType}


def unpermute_weight(weight: Weight, num_heads: int) -> Weight:
    def rows(tensor: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(unpermute(tensor.numpy(), num_heads)))

    if isinstance(weight, (GroupQuantized, ByteQuantized)):
        fields = {f.name: rows(getattr(weight, f.name)) for f in attrs.fields(type(weight)) if f.name != "codes"}
        codes = None if weight.codes is None else tuple(Codes(rows(c.base), rows(c.codes)) for c in weight.codes)
        return type(weight)(**fields, codes=codes)
    return rows(weight)


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in GGUF_NAMES:
        return GGUF_NAMES[gguf_name]
    parts = gguf_name.split(".")  # blk.<i>.<name>.<weight|bias>
    if parts[0] == "blk" and parts[2] in GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def tensor_shape(info: TensorInfo) -> tuple[int, int]:
    """A tensor's bytes as rows, ``(rows, bytes per row)``: a row is the innermost dimension, as
    ``gguf.quants.dequantize`` takes it."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(info.ggml_type)]
    return int(np.prod(info.shape[1:], dtype=np.int64)), info.shape[0] // block * size


def tensor_data(info: TensorInfo, path: Path) -> np.ndarray:
    """A tensor's bytes, read from the file once (``[rows, bytes per row]``): only the tensor being
    decoded is in memory, where a memory map would keep every page it touched resident."""
    rows, row_bytes = tensor_shape(info)
    data = np.fromfile(path, dtype=np.uint8, count=rows * row_bytes, offset=info.offset)
    if data.size != rows * row_bytes:
        raise ConfigError(f"{path}: tensor {info.name} runs past the end of the file", param="model")
    return data.reshape(rows, row_bytes)


def gguf_config(reader: GGUFHeader, path: Path) -> ModelConfig:
    arch = reader.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ConfigError(
            f"{path.name}: unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}",
            param="model",
        )
    hidden = reader.get(f"{arch}.embedding_length")
    num_heads = reader.get(f"{arch}.attention.head_count")
    tokens = reader.get("tokenizer.ggml.tokens") or []
    tensors = {t.name: t for t in reader.tensors}
    head_size = reader.get(f"{arch}.attention.key_length") or hidden // num_heads
    rotated = reader.get(f"{arch}.rope.dimension_count") or head_size
    if rotated != head_size:
        raise ConfigError(
            f"{path.name}: RoPE over {rotated} of each head's {head_size} dimensions is not supported", param="model"
        )
    scaling = reader.get(f"{arch}.rope.scaling.type") or "none"
    if scaling not in ("none", "linear"):
        raise ConfigError(f"{path.name}: unsupported RoPE scaling {scaling!r}; supported: none, linear", param="model")
    factors = tensors.get("rope_freqs.weight")
    return ModelConfig(
        name=reader.get("general.name") or path.stem,
        vocab_size=reader.get(f"{arch}.vocab_size") or len(tokens),
        hidden_size=hidden,
        intermediate_size=reader.get(f"{arch}.feed_forward_length"),
        num_layers=reader.get(f"{arch}.block_count"),
        num_heads=num_heads,
        num_kv_heads=reader.get(f"{arch}.attention.head_count_kv") or num_heads,
        head_size=head_size,
        rope_theta=float(reader.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(reader.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=reader.get(f"{arch}.context_length", 2048),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        head_norm="blk.0.attn_q_norm.weight" in tensors,
        eos_token_ids=token_ids(reader.get("tokenizer.ggml.eos_token_id"), reader.get("tokenizer.ggml.eot_token_id")),
        rope_scaling={"rope_type": "linear", "factor": float(reader.get(f"{arch}.rope.scaling.factor"))}
        if scaling == "linear"
        else None,
        rope_frequency_factors=_rope_factors(factors, path) if factors is not None else None,
    )


def _rope_factors(tensor: TensorInfo, path: Path) -> tuple[float, ...]:
    """``rope_freqs.weight``, which llama.cpp's converter writes for Llama 3's scaled RoPE."""
    return tuple(
        gguf.quants.dequantize(tensor_data(tensor, path), gguf.GGMLQuantizationType(tensor.ggml_type)).ravel().tolist()
    )


Loaders = dict[str, Callable[[], Weight]]
"""Each weight's Hugging Face name and how to read it: the model reads a layer's weights as it builds
that layer, so no more than one layer's are decoded at a time."""


def _read_gguf_tensor(
    tensor: TensorInfo, kind: gguf.GGMLQuantizationType, path: Path, keep_quantized: bool, heads: int
) -> Weight:
    """One tensor: its group form (``keep_quantized``, where it has one) or float32, with llama.cpp's
    q/k row permutation undone over ``heads`` heads (0: none)."""
    raw = tensor_data(tensor, path)
    weight: Weight | None = group_form(raw, kind) if keep_quantized and len(tensor.shape) == 2 else None
    if weight is None:
        dense = gguf.quants.dequantize(raw, kind).astype(np.float32, copy=False).reshape(tuple(reversed(tensor.shape)))
        weight = torch.from_numpy(np.require(dense, requirements=["C", "W"]))
    return unpermute_weight(weight, heads) if heads else weight


def load_gguf(path: Path, keep_quantized: bool = False) -> tuple[ModelConfig, Loaders]:
    """The model's config and its weights' loaders, each giving a float32 tensor or, with
    ``keep_quantized``, the weight's exact group form where its type has one."""
    reader = parse(read_gguf_header, path)
    config = gguf_config(reader, path)
    permuted = reader.get("general.architecture") == "llama"
    loaders: Loaders = {}
    dense_only: dict[str, int] = {}
    dense_types = DENSE_ONLY_TYPES if fine_groups_run_packed() else DENSE_ONLY_TYPES | FINE_TYPES
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            continue
        kind = gguf.GGMLQuantizationType(tensor.ggml_type) if tensor.ggml_type in _TYPE_NUMBERS else None
        if kind not in GGUF_TYPES:
            raise ConfigError(
                f"{path.name}: tensor {tensor.name} has unsupported type {kind.name if kind else tensor.ggml_type}",
                param="model",
            )
        if keep_quantized and kind in dense_types:
            dense_only[kind.name] = dense_only.get(kind.name, 0) + int(np.prod(tensor_shape(tensor)))
        heads = (
            (config.num_heads if "q_proj" in name else config.num_kv_heads if "k_proj" in name else 0)
            if permuted
            else 0
        )
        loaders[name] = functools.partial(_read_gguf_tensor, tensor, kind, path, keep_quantized, heads)
    for kind_name, size in dense_only.items():
        log.warning(
            "weights dequantized to dense: no packed kernel for this type",
            model=path.name,
            type=kind_name,
            file_mib=round(size / 2**20, 1),
        )
    return config, loaders


def load_hf_folder(folder: Path) -> tuple[ModelConfig, Loaders]:
    """A Hugging Face folder: config.json plus model.safetensors (or shards listed in an index), each
    tensor read from the memory-mapped file in the dtype the file stores it in."""
    generation = folder / "generation_config.json"
    config = ModelConfig.from_hf(
        json.loads((folder / "config.json").read_text()),
        folder.name,
        json.loads(generation.read_text()) if generation.is_file() else None,
    )
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ConfigError(f"{folder}: no model.safetensors (or index) found", param="model")

    loaders: Loaders = {}
    for file in files:
        weights = safe_open(str(folder / file), framework="pt")  # open while a loader refers to it
        loaders.update({name: functools.partial(weights.get_tensor, name) for name in weights.keys()})
    return config, loaders


def load_weights(path: Path, keep_quantized: bool = False) -> tuple[ModelConfig, Loaders]:
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, keep_quantized)
    if path.is_dir():
        return load_hf_folder(path)
    raise ConfigError(f"cannot load a model from {str(path)!r}: expected a .gguf file or a folder", param="model")
