"""The safetensors path and the paged forward pass, on tiny random models checked against transformers."""

from __future__ import annotations

import shutil

import pytest
import torch

from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.params import GenerationParams
from hetero_core.testing import ExecutorContract
from hetero_executor_torch import TorchExecutor
from hetero_executor_torch.quantized import PACKED_MAX_ROWS, PackedLinear, fine_groups_run_packed

from .conftest import tiny_engine, write_tiny_gguf, write_tiny_model

transformers = pytest.importorskip("transformers")


def our_logits(executor: TorchExecutor, ids: list[int]) -> torch.Tensor:
    """Logits at every position from one whole-sequence prefill through the paged cache."""
    executor.initialize_cache(64, 4)
    return executor.prefill_logits(ids, list(range(2, 2 + -(-len(ids) // 4))))


ARCHITECTURES = [
    ("llama", False),
    ("llama", True),
    ("llama3", False),
    ("qwen2", False),
    ("qwen3", False),
    ("qwen3", True),
]


@pytest.mark.parametrize("source", ["folder", "gguf"])
@pytest.mark.parametrize(("architecture", "tie"), ARCHITECTURES)
def test_logits_match_transformers(tmp_path, architecture: str, tie: bool, source: str) -> None:
    """From the Hugging Face folder and from the same weights written as llama.cpp writes a GGUF file."""
    folder = write_tiny_model(tmp_path, architecture=architecture, tie=tie, seed=3)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = folder if source == "folder" else write_tiny_gguf(folder, tmp_path / "tiny.gguf")
    executor = TorchExecutor(EngineConfig(model=str(model)), dtype="float32")
    ids = torch.randint(0, 259, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(our_logits(executor, ids).cpu(), expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("weight_type", ["Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "Q6_K"])
@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_a_quantized_gguf_runs_packed_as_it_runs_dense(tmp_path, architecture: str, weight_type: str) -> None:
    """The same quantized file in bf16, its weights packed (on whichever kernels this CPU runs, a
    prefill widening them) and dequantized dense: against the float32 model of the file's weights,
    the packed path errs at most about as much as dense bf16 does (the layouts are right). Q6_K's
    blocks of 256 take a wider model."""
    gguf = pytest.importorskip("gguf")
    width = 256 if weight_type == "Q6_K" else 64
    folder = write_tiny_model(
        tmp_path, architecture=architecture, seed=5, hidden_size=width, intermediate_size=max(96, width)
    )
    path = write_tiny_gguf(folder, tmp_path / "tiny.gguf", gguf.GGMLQuantizationType[weight_type])
    ids = torch.randint(0, 259, (29,), generator=torch.Generator().manual_seed(2)).tolist()
    reference = our_logits(TorchExecutor(EngineConfig(model=str(path)), dtype="float32"), ids)
    dense = TorchExecutor(EngineConfig(model=str(path)), dtype="bfloat16", weights="dense")
    packed = TorchExecutor(EngineConfig(model=str(path)), dtype="bfloat16", weights="auto")
    assert (
        isinstance(packed.model.layers[0].gate_up, PackedLinear)
        or weight_type == "Q6_K"
        and not fine_groups_run_packed()
    )
    dense_error = float((our_logits(dense, ids) - reference).abs().max())
    packed_error = float((our_logits(packed, ids) - reference).abs().max())
    assert packed_error <= 2 * dense_error + 1e-3, (packed_error, dense_error)


class TestTinyModelExecutorContract(ExecutorContract):
    @pytest.fixture(scope="class")
    @classmethod
    def executor(cls, tiny_model):
        return TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32")


PROMPTS = ["The first prompt", "a second, longer prompt that spans several blocks", "x", "The first prompt again"]


def outputs(engine, prompts, params) -> list[list[list[int]]]:
    return [[o.token_ids for o in r.outputs] for r in engine.generate(prompts, params)]


@pytest.fixture(scope="module")
def one_at_a_time(tiny_model):
    engine = tiny_engine(
        tiny_model, enable_chunked_prefill=False, cache_allocator={"name": "paged", "enable_prefix_caching": False}
    )
    params = GenerationParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    return [outputs(engine, [p], params)[0] for p in PROMPTS]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"max_total_tokens": 7},  # chunked prefill mixed with decodes
        {"max_num_blocks": 20, "max_model_len": 80},  # constant preemption
        {"max_batch_size": 2},
    ],
    ids=["batched", "chunked", "preempting", "small-batches"],
)
def test_batched_generation_equals_one_at_a_time(tiny_model, one_at_a_time, overrides) -> None:
    engine = tiny_engine(tiny_model, **overrides)
    got = outputs(engine, PROMPTS, GenerationParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    assert got == one_at_a_time
    if "max_num_blocks" in overrides:
        assert engine.metrics.num_preemptions > 0
    assert engine.get_memory_stats().used_blocks == 0


def test_prefix_cache_hits_do_not_change_outputs(tiny_model, one_at_a_time) -> None:
    engine = tiny_engine(tiny_model)
    engine.generate([PROMPTS[3]], GenerationParams(temperature=0.0, max_tokens=2))  # caches the shared prefix
    got = outputs(engine, PROMPTS, GenerationParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    assert engine.metrics.prefix_cache_hits > 0
    assert got == one_at_a_time


def test_parallel_greedy_samples_equal_the_single_answer(tiny_model, one_at_a_time) -> None:
    engine = tiny_engine(tiny_model)
    record = engine.generate([PROMPTS[1]], GenerationParams(temperature=0.0, max_tokens=24, ignore_eos=True, n=3))[0]
    assert [o.token_ids for o in record.outputs] == one_at_a_time[1] * 3


def test_seeded_sampling_reproduces_across_batches_and_pressure(tiny_model) -> None:
    params = GenerationParams(temperature=1.0, top_p=0.9, top_k=50, seed=11, max_tokens=20, ignore_eos=True)
    alone = outputs(tiny_engine(tiny_model), [PROMPTS[1]], params)[0]
    crowded = outputs(tiny_engine(tiny_model, max_num_blocks=20, max_model_len=80), PROMPTS, params)[1]
    assert crowded == alone


def test_pool_sized_from_memory(tiny_model) -> None:
    engine = tiny_engine(tiny_model, kv_cache_memory_mb=1)
    block_bytes = engine.executor.kv_cache_block_bytes(4)
    assert block_bytes == 2 * 2 * 4 * 2 * 16 * 4  # k+v, layers, slots, kv heads, head size, fp32
    assert engine.num_blocks == 2**20 // block_bytes


class TestNumbaAttentionExecutorContract(ExecutorContract):
    @pytest.fixture(scope="class")
    @classmethod
    def executor(cls, tiny_model):
        return TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", device="cpu", attention="numba")


@pytest.mark.parametrize(
    "overrides",
    [{}, {"max_total_tokens": 7}, {"max_num_blocks": 20, "max_model_len": 80}],
    ids=["batched", "chunked", "preempting"],
)
def test_numba_attention_gives_the_same_tokens(tiny_model, one_at_a_time, overrides) -> None:
    engine = tiny_engine(
        tiny_model, executor={"name": "torch", "dtype": "float32", "device": "cpu", "attention": "numba"}, **overrides
    )
    assert outputs(engine, PROMPTS, GenerationParams(temperature=0.0, max_tokens=24, ignore_eos=True)) == one_at_a_time


def test_numba_attention_is_refused_off_the_cpu(tiny_model) -> None:
    with pytest.raises(ConfigError, match="numba-cuda") as raised:
        TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", device="meta", attention="numba")
    assert raised.value.param == "attention"


def test_a_model_lacking_a_layers_weight_is_refused_by_its_name(tiny_model, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "incomplete"
    shutil.copytree(tiny_model, folder)
    (weights,) = folder.glob("*.safetensors")
    tensors = load_file(weights)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="lacks the weight model.layers.1.mlp.down_proj.weight") as raised:
        tiny_engine(folder)
    assert raised.value.param == "model"


def test_prompt_logprobs_do_not_depend_on_chunking_slicing_or_the_cache(tiny_model) -> None:
    long_prompt = "the quick brown fox " * 15  # 300 tokens: scored in two slices of rows when computed whole
    params = GenerationParams(max_tokens=0, prompt_logprobs=3)
    whole = tiny_engine(tiny_model, max_total_tokens=512).generate([long_prompt], params)[0]
    chunked_engine = tiny_engine(tiny_model, max_total_tokens=7)
    chunked_engine.generate([long_prompt], GenerationParams(max_tokens=1))  # its blocks now in the prefix cache
    chunked = chunked_engine.generate([long_prompt], params)[0]
    assert chunked.num_cached_tokens == 0 and len(whole.prompt_logprobs) == len(chunked.prompt_logprobs) == 300
    for a, b in zip(whole.prompt_logprobs[1:], chunked.prompt_logprobs[1:], strict=True):
        assert (a.token_id, a.rank, [t for t, _ in a.top]) == (b.token_id, b.rank, [t for t, _ in b.top])
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)


@pytest.mark.parametrize("weight_type", ["Q8_0", "Q4_0"])
def test_the_cpu_warm_up_stays_within_every_packed_layers_rows(tmp_path, monkeypatch, weight_type: str) -> None:
    """Widening a whole model's packed weights is the cost the warm-up must not pay at every start: its steps
    stay within the rows each packed layer multiplies as it is (8-bit layers take fewer than 4-bit ones)."""
    gguf = pytest.importorskip("gguf")
    folder = write_tiny_model(tmp_path, seed=5)
    path = write_tiny_gguf(folder, tmp_path / "tiny.gguf", gguf.GGMLQuantizationType[weight_type])
    executor = TorchExecutor(EngineConfig(model=str(path)), dtype="bfloat16", weights="auto", device="cpu")
    layers = [linear for layer in executor.model.layers for linear in layer.linears]
    packed = [linear for linear in layers if isinstance(linear, PackedLinear)]
    assert packed, "no layer runs packed here"
    assert executor.model.packed_rows() == min(linear.max_rows for linear in packed)
    # a speculative step stays unwidened too, within the rows of a plain step of many sequences, and
    # within the rows its layers take as one call each where they can
    assert executor.max_verify_tokens <= min(PACKED_MAX_ROWS, *(linear.unwidened_rows() for linear in packed))
    if executor.model.fused is not None and executor.model.fused.packed_rows:
        assert executor.max_verify_tokens == executor.model.fused.packed_rows
    widened: list[PackedLinear] = []

    def widen(self: PackedLinear, x: torch.Tensor) -> torch.Tensor:
        widened.append(self)
        return torch.zeros(x.shape[0], self.out_features, dtype=x.dtype)

    monkeypatch.setattr(PackedLinear, "_widened", widen)
    executor.initialize_cache(64, 4)
    executor.warm_up(256, 32)
    if executor.model.packed_rows() >= 2:  # two rows is the least a warm-up prefill takes
        assert not [linear for linear in widened if any(linear is layer for layer in layers)]
