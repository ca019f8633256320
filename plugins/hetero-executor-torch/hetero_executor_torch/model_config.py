"""The hyperparameters of a Llama-family model, from GGUF metadata or a Hugging Face config.json."""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from hetero_core.errors import ConfigError

# Hugging Face architectures served by the Llama forward pass (Qwen2 adds q/k/v biases, Qwen3 an RMSNorm
# of each query and key head before RoPE).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")  # RoPE scalings the forward pass computes


@attrs.frozen
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()  # every id that ends generation
    rope_scaling: Mapping[str, Any] | None = None  # Hugging Face's, of a type in ROPE_TYPES
    rope_frequency_factors: tuple[float, ...] | None = None  # GGUF's rope_freqs: each frequency divided by its factor
    head_norm: bool = False  # an RMSNorm over each query and key head before RoPE (Qwen3)

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], name: str, generation: Mapping[str, Any] | None = None) -> ModelConfig:
        """From ``config.json`` (and ``generation_config.json``, whose end-of-sequence ids count too)."""
        architectures = config.get("architectures") or []
        architecture = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
        if architecture is None:
            raise ConfigError(
                f"unsupported architecture {architectures}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}",
                param="model",
            )
        num_heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        # attention over a sliding window equals full attention up to the window's length: the context stops there
        positions = config.get("max_position_embeddings", 2048)
        windowed = config.get("use_sliding_window", architecture == "MistralForCausalLM")
        if windowed and config.get("sliding_window"):
            positions = min(positions, config["sliding_window"])
        # transformers 5 writes RoPE's settings as rope_parameters; earlier versions as rope_theta and rope_scaling
        rope = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), Mapping) else {}
        scaling = config.get("rope_scaling") or rope
        rope_type = (
            scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, Mapping) else "default"
        )
        if rope_type not in ROPE_TYPES:
            raise ConfigError(
                f"{name}: unsupported RoPE scaling {rope_type!r}; supported: {', '.join(ROPE_TYPES)}", param="model"
            )
        return cls(
            name=name,
            vocab_size=config["vocab_size"],
            hidden_size=hidden,
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_size=config.get("head_dim") or hidden // num_heads,
            rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=positions,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=SUPPORTED_ARCHITECTURES[architecture] == "qwen2"
            or bool(config.get("attention_bias", False)),
            eos_token_ids=token_ids(config.get("eos_token_id"), (generation or {}).get("eos_token_id")),
            rope_scaling=dict(scaling, rope_type=rope_type) if rope_type != "default" else None,
            head_norm=SUPPORTED_ARCHITECTURES[architecture] == "qwen3",
        )


def token_ids(*values: Any) -> tuple[int, ...]:
    """The distinct token ids among ``values``, each an id, a list of ids or None, in order."""
    ids: list[int] = []
    for value in values:
        for token_id in value if isinstance(value, list) else [value]:
            if isinstance(token_id, int) and not isinstance(token_id, bool) and token_id not in ids:
                ids.append(token_id)
    return tuple(ids)
