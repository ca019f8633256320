"""GGUF dequantization and the q/k row permutation, on small hand-made tensors."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_executor_torch import TorchExecutor
from hetero_executor_torch.loading import unpermute

TYPES = [
    (gguf.GGMLQuantizationType.F32, 0.0),
    (gguf.GGMLQuantizationType.F16, 1e-3),
    (gguf.GGMLQuantizationType.BF16, 1e-2),
    (gguf.GGMLQuantizationType.Q8_0, 2e-2),
    (gguf.GGMLQuantizationType.Q4_1, 0.15),
    (gguf.GGMLQuantizationType.Q4_0, 0.3),
]


@pytest.mark.parametrize(("kind", "tolerance"), TYPES, ids=[t.name for t, _ in TYPES])
def test_quantize_dequantize_round_trip(kind, tolerance: float) -> None:
    weights = np.random.default_rng(0).uniform(-1, 1, size=(4, 64)).astype(np.float32)
    restored = gguf.quants.dequantize(gguf.quants.quantize(weights, kind), kind)
    assert restored.shape == weights.shape
    assert np.abs(restored - weights).max() <= tolerance + 1e-7


def test_q4_1_layout_matches_the_documented_block() -> None:
    """32 weights in 20 bytes: f16 scale, f16 min, 16 bytes of nibbles; low nibble = weight i, high = weight i + 16."""
    nibbles = np.arange(32) % 16
    block = np.zeros(20, dtype=np.uint8)
    block[0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    block[2:4] = np.frombuffer(np.float16(-1.0).tobytes(), np.uint8)
    block[4:] = nibbles[:16] | (nibbles[16:] << 4)
    weights = gguf.quants.dequantize(block[None], gguf.GGMLQuantizationType.Q4_1)
    np.testing.assert_allclose(weights[0], 0.5 * nibbles - 1.0)


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows (written from its documented behaviour)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


@pytest.mark.parametrize("num_heads", [1, 3, 9])
def test_unpermute_inverts_the_converter(num_heads: int) -> None:
    weight = np.random.default_rng(1).normal(size=(num_heads * 8, 5)).astype(np.float32)
    np.testing.assert_array_equal(unpermute(llama_cpp_permute(weight, num_heads), num_heads), weight)


def test_unsupported_architecture_is_a_clear_error(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ConfigError, match="unsupported architecture"):
        TorchExecutor(EngineConfig(model=str(tmp_path)), dtype="float32")


def test_a_rope_scaling_the_forward_pass_does_not_compute_is_refused(tmp_path) -> None:
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "num_attention_heads": 4,
        "hidden_size": 64,
        "vocab_size": 10,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "rope_scaling": {"type": "yarn", "factor": 4.0},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="unsupported RoPE scaling 'yarn'; supported: default, linear, llama3"):
        TorchExecutor(EngineConfig(model=str(tmp_path)), dtype="float32")


def test_a_gguf_rope_scaling_the_forward_pass_does_not_compute_is_refused(tmp_path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "yarn.gguf"), "qwen2")
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_tensor("token_embd.weight", np.zeros((10, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match="yarn.gguf: unsupported RoPE scaling 'yarn'; supported: none, linear"):
        TorchExecutor(EngineConfig(model=str(tmp_path / "yarn.gguf")), dtype="float32")


@pytest.mark.parametrize(
    ("architecture", "extra", "positions"),
    [
        ("MistralForCausalLM", {"sliding_window": 256}, 256),
        ("MistralForCausalLM", {"sliding_window": None}, 1024),
        ("Qwen2ForCausalLM", {"sliding_window": 256, "use_sliding_window": False}, 1024),
        ("Qwen2ForCausalLM", {"sliding_window": 256, "use_sliding_window": True}, 256),
    ],
)
def test_a_sliding_window_bounds_the_context(architecture: str, extra: dict, positions: int) -> None:
    """Full attention computes a windowed model exactly up to its window, so the context ends there."""
    from hetero_executor_torch.model_config import ModelConfig

    config = {
        "architectures": [architecture],
        "num_attention_heads": 4,
        "hidden_size": 64,
        "vocab_size": 10,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "max_position_embeddings": 1024,
        **extra,
    }
    assert ModelConfig.from_hf(config, "m").max_position_embeddings == positions


def test_bad_dtype_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="dtype must be one of"):
        TorchExecutor(EngineConfig(model=str(tmp_path)), dtype="float64")


def test_auto_dtype_on_cuda_is_float16_for_a_gguf_and_bfloat16_for_a_checkpoint(monkeypatch) -> None:
    import torch

    from hetero_executor_torch import executor

    cuda = torch.device("cuda")
    assert executor.resolve_dtype("auto", cuda, gguf=True) == torch.float16
    assert executor.resolve_dtype("auto", cuda, gguf=False) == torch.bfloat16
    assert executor.resolve_dtype("bfloat16", cuda, gguf=True) == torch.bfloat16
    monkeypatch.setattr(executor, "cpu_has_fast_bf16", lambda: True)
    assert executor.resolve_dtype("auto", torch.device("cpu"), gguf=True) == torch.bfloat16


def test_auto_weights_stay_packed_on_the_cpu_unless_float32_is_asked_for() -> None:
    """A CPU without fast bf16 gets float32 from ``dtype: auto``; its quantized weights stay packed there."""
    import torch

    from hetero_executor_torch.executor import resolve_weight_format

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_weight_format("auto", cpu, torch.bfloat16) == "auto"
    assert resolve_weight_format("auto", cpu, torch.float32, dtype_option="auto") == "auto"
    assert resolve_weight_format("auto", cpu, torch.float32, dtype_option="float32") == "dense"
    assert resolve_weight_format("auto", cuda, torch.float16) == "dense"


def test_every_end_of_sequence_id_of_config_and_generation_config_counts() -> None:
    from hetero_executor_torch.model_config import token_ids

    assert token_ids(2, None) == (2,)
    assert token_ids([128001, 128009], 128001) == (128001, 128009)
    assert token_ids(None, [5, True, "x", 6]) == (5, 6)
