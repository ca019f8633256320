"""The numba-cuda executor gives the torch executor's greedy tokens and prompt logprobs
(on the CUDA simulator when no GPU),
its layers' small ops fused into ``hetero_kernels.cuda_fused`` kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch

from hetero_core import EngineConfig, GenerationParams
from hetero_core.engine import InferenceEngine
from hetero_core.errors import ConfigError

PROMPTS = ["hi there", "a longer prompt"]
SCRIPT = Path(__file__).with_name("simulated_generation.py")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=259,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    folder = tmp_path_factory.mktemp("tiny")
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def torch_outputs(model: Path) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and prompt logprobs (chunked prefill) of the torch executor."""
    engine = InferenceEngine(
        EngineConfig(
            model=str(model),
            tokenizer="simple",
            executor={"name": "torch", "dtype": "float32"},
            block_size=4,
            max_num_blocks=64,
            max_model_len=128,
            max_total_tokens=6,
        )
    )
    records = engine.generate(
        PROMPTS, GenerationParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=1)
    )
    return [(r.generated_tokens, [e.logprob for e in r.prompt_logprobs[1:]]) for r in records]


@pytest.mark.parametrize(
    "executor",
    [
        {"name": "numba-cuda", "dtype": "float32", "decode_graphs": False},
        {"name": "numba-cuda", "dtype": "float32", "decode_graphs": True},
        {"name": "torch", "attention": "numba-cuda", "dtype": "float32", "decode_graphs": False},
    ],
    ids=["eager", "graphs", "torch-executor"],
)
def test_same_greedy_tokens_as_the_torch_executor(tiny_model, executor: dict) -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"} if not torch.cuda.is_available() else dict(os.environ)
    arguments = [str(tiny_model), json.dumps(PROMPTS), json.dumps(executor)]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *arguments], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert (got["graphs"] > 0) == executor["decode_graphs"]  # a failed capture would have turned them off
    assert got["fused"] == "hetero_kernels.cuda_fused"  # norms, RoPE with the cache write, SwiGLU: one kernel each
    for (tokens, logprobs), (expected_tokens, expected_logprobs) in zip(
        got["outputs"], torch_outputs(tiny_model), strict=True
    ):
        assert tokens == expected_tokens
        assert logprobs == pytest.approx(expected_logprobs, abs=1e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error shown when there is no GPU")
def test_without_a_gpu_the_error_says_what_to_do(tiny_model) -> None:
    from hetero_executor_numba import numba_cuda_executor

    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        numba_cuda_executor(EngineConfig(model=str(tiny_model)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error shown when there is no GPU")
def test_the_torch_executor_finds_the_backend_by_name_and_refuses_it_without_a_gpu(tiny_model) -> None:
    from hetero_executor_torch import TorchExecutor

    with pytest.raises(ConfigError, match="'numba-cuda' runs the Numba CUDA kernels") as raised:
        TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", attention="numba-cuda")
    assert raised.value.param == "attention"


def test_the_preset_takes_the_torch_executors_options_with_this_backend() -> None:
    from hetero_executor_numba.plugin import NumbaCudaExecutorOptions
    from hetero_executor_torch import TorchExecutorOptions

    assert sorted(f.name for f in attrs.fields(NumbaCudaExecutorOptions)) == sorted(
        f.name for f in attrs.fields(TorchExecutorOptions)
    )
    assert NumbaCudaExecutorOptions().attention == "numba-cuda"
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        NumbaCudaExecutorOptions(kv_cache_dtype="float64")


def test_the_preset_refuses_another_attention_backend(tiny_model) -> None:
    from hetero_executor_numba import numba_cuda_executor

    with pytest.raises(
        ConfigError, match="runs attention 'numba-cuda', not 'torch'; for another backend use executor 'torch'"
    ) as raised:
        numba_cuda_executor(EngineConfig(model=str(tiny_model)), attention="torch")
    assert raised.value.param == "attention"


def test_every_cache_dtype_of_the_torch_executor_is_taken_on_cuda() -> None:
    from hetero_executor_numba import NumbaCudaAttention

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert NumbaCudaAttention().configure(torch.device("cuda"), dtype) == dtype
