"""Fixtures: a tiny random Llama written in Hugging Face format, and engines over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine

torch.set_num_threads(2)


LLAMA3_ROPE = {  # Llama 3.1's scaling, its original context short enough to scale some of a tiny head's frequencies
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def write_tiny_model(
    folder: Path,
    *,
    architecture: str = "llama",
    tie: bool = False,
    seed: int = 0,
    intermediate_size: int = 96,
    hidden_size: int = 64,
) -> Path:
    """A random 2-layer model with grouped-query attention, saved as config.json + safetensors (Qwen3's
    heads are wider than ``hidden_size / num_attention_heads``, as its real models' are; ``llama3`` is a
    Llama with Llama 3.1's RoPE scaling)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    common = dict(
        vocab_size=259,  # the simple tokenizer's
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=50000.0,  # not the default, so that a loader reading the wrong key fails
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        eos_token_id=257,
    )
    if architecture == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    elif architecture == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=32))
        with torch.no_grad():  # the head norms start at ones: make them matter
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    elif architecture == "llama3":
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(**common, rope_scaling=dict(LLAMA3_ROPE, rope_theta=common["rope_theta"]))
        )
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def tiny_engine(model: Path, **overrides: Any) -> InferenceEngine:
    values: dict[str, Any] = dict(
        model=str(model),
        tokenizer="simple",
        executor={"name": "torch", "dtype": "float32"},
        block_size=4,
        max_num_blocks=256,
        max_model_len=512,
    )
    values.update(overrides)
    return InferenceEngine(EngineConfig.from_mapping(values))


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def rope_divisors(folder: Path) -> Any:
    """RoPE's unscaled frequencies over those transformers computes for the model in ``folder``."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    scaled, _ = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    half = scaled.numel()
    theta = config.rope_parameters["rope_theta"] if getattr(config, "rope_parameters", None) else config.rope_theta
    default = 1.0 / theta ** (torch.arange(half, dtype=torch.float32) / half)
    return (default / scaled).numpy()


def quantize_q6_k(weights: Any) -> Any:
    """float32 ``[rows, in]`` (``in`` a multiple of 256) as Q6_K blocks, by rounding to nearest (gguf's
    Python package dequantizes Q6_K but cannot quantize to it): each 16 inputs' scale a signed byte
    times the block's f16 ``d``, each input ``q`` 0..63 for ``q - 32``, laid out as ``gguf.quants``
    reads them."""
    import numpy as np

    rows = weights.shape[0]
    groups = weights.reshape(-1, 16, 16).astype(np.float64)
    group_scale = np.abs(groups).max(-1) / 31
    d = (group_scale.max(-1) / 127).astype(np.float16)
    unit = np.where(d == 0, 1.0, d.astype(np.float64))
    sc = np.clip(np.rint(group_scale / unit[:, None]), 1, 127)
    q = (np.clip(np.rint(groups / (unit[:, None] * sc)[..., None]), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)
    low = q & 15  # chunk c, input 64s + l: byte 64c + l, nibble s
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(-1, 128)
    top = (q >> 4).reshape(-1, 2, 4, 32)  # chunk c, input 32s + l: byte 32c + l, bits 2s
    qh = (top[:, :, 0] | (top[:, :, 1] << 2) | (top[:, :, 2] << 4) | (top[:, :, 3] << 6)).reshape(-1, 64)
    blocks = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d.reshape(-1, 1).view(np.uint8)], axis=1)
    return blocks.reshape(rows, -1)


def write_tiny_gguf(folder: Path, path: Path, weight_type: Any = None) -> Path:
    """The model in ``folder`` (from :func:`write_tiny_model`) as a GGUF file, the way llama.cpp's
    converter writes one: its tensor names and metadata, a Llama's q/k rows interleaved for pairwise
    RoPE, linear weights in ``weight_type`` (a ``gguf.GGMLQuantizationType`` gguf can quantize to,
    or Q6_K; Q8_0 for rows not a whole number of its blocks; float32 by default), norms and biases in
    float32."""
    import functools
    import json

    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((folder / "config.json").read_text())
    arch = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}[
        config["architectures"][0]
    ]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config.get("rope_theta") or config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_eos_token_id(config["eos_token_id"])
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if scaling.get("rope_type") == "llama3":  # the converter's rope_freqs: each frequency's divisor
        writer.add_tensor("rope_freqs.weight", rope_divisors(folder))

    def interleave(weight: np.ndarray, count: int) -> np.ndarray:  # llama.cpp's permute, undone by the loader
        return (
            weight.reshape(count, 2, weight.shape[0] // count // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape)
        )

    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if name in GGUF_NAMES:
            target = GGUF_NAMES[name]
        else:
            _, _, index, *rest = name.split(".")
            module, suffix = ".".join(rest[:-1]), rest[-1]
            target = f"blk.{index}.{GGUF_LAYER_NAMES[module]}.{suffix}"
        tensor = tensor.astype(np.float32)
        if arch == "llama" and ".attn_q." in target or arch == "llama" and ".attn_k." in target:
            tensor = interleave(tensor, heads if ".attn_q." in target else kv_heads)
        if weight_type is not None and tensor.ndim == 2:
            # as llama.cpp's quantizer does, Q8_0 where a row is not a whole number of the type's blocks
            kind = (
                weight_type
                if tensor.shape[1] % gguf.GGML_QUANT_SIZES[weight_type][0] == 0
                else gguf.GGMLQuantizationType.Q8_0
            )
            quantize = (
                quantize_q6_k
                if kind == gguf.GGMLQuantizationType.Q6_K
                else functools.partial(gguf.quants.quantize, qtype=kind)
            )
            writer.add_tensor(target, quantize(tensor), raw_dtype=kind)
        else:
            writer.add_tensor(target, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
