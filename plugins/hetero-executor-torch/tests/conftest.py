"""Fixtures: a tiny random Llama written in Hugging Face format, and engines over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine

torch.set_num_threads(2)


def write_tiny_model(folder: Path, *, architecture: str = "llama", tie: bool = False, seed: int = 0, intermediate_size: int = 96) -> Path:
    """A random 2-layer model with grouped-query attention, saved as config.json + safetensors."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    common = dict(
        vocab_size=259,  # the simple tokenizer's
        hidden_size=64,
        intermediate_size=intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        eos_token_id=257,
    )
    if architecture == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
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
