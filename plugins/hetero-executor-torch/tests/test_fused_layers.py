"""The fused layers (``attention: numba`` on the CPU) compute what the torch ops compute, rounding where they round."""

from __future__ import annotations

import random
import types

import pytest
import torch
import torch.nn.functional as F

from hetero_core.batch import ExecutionBatch, ScheduledSequence
from hetero_core.config import EngineConfig
from hetero_core.params import GenerationParams
from hetero_core.step_layout import layout
from hetero_executor_torch import TorchExecutor
from hetero_executor_torch.kernel_attention import kernel_array
from hetero_executor_torch.model import LlamaModel

from .conftest import write_tiny_gguf, write_tiny_model

cpu_fused = pytest.importorskip("hetero_kernels.cpu_fused", reason="hetero_kernels not installed")

BLOCK_SIZE = 4
GREEDY = GenerationParams(temperature=0.0, max_tokens=4)


def test_bfloat16_rope_and_cache_writes_round_as_the_torch_ops() -> None:
    """Keys land in the cache exactly as the model's bf16 RoPE computes them; with one position to
    attend to, attention returns the value itself."""
    torch.manual_seed(0)
    batch, heads, kv_heads, head_size = 6, 4, 2, 64
    qkv = (torch.randn(batch, (heads + 2 * kv_heads) * head_size) * 3).bfloat16()
    angles = torch.rand(batch, head_size // 2) * 100
    cos, sin = (f(torch.cat([angles, angles], dim=-1)).bfloat16() for f in (torch.cos, torch.sin))
    k_cache = torch.zeros(batch, BLOCK_SIZE, kv_heads, head_size, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.arange(batch, dtype=torch.int32)[:, None]
    slots = tables[:, 0].long() * BLOCK_SIZE
    out = torch.empty(batch, heads, head_size, dtype=torch.bfloat16)
    cpu_fused.rotary_decode_attention(
        kernel_array(out),
        kernel_array(qkv),
        kernel_array(cos),
        kernel_array(sin),
        kernel_array(k_cache),
        kernel_array(v_cache),
        slots.numpy(),
        tables.numpy(),
        torch.ones(batch, dtype=torch.int32).numpy(),
        heads,
        0.125,
    )
    parts = qkv.view(batch, heads + 2 * kv_heads, head_size)
    keys = LlamaModel.rotate(parts[:, heads : heads + kv_heads], cos[:, None], sin[:, None])
    values = parts[:, heads + kv_heads :]
    assert torch.equal(k_cache[:, 0], keys)
    assert torch.equal(v_cache[:, 0], values)
    assert torch.equal(out, values.repeat_interleave(heads // kv_heads, dim=1))


def test_bfloat16_norm_is_within_one_rounding_of_the_torch_op() -> None:
    """The mean of squares is summed in another order, which can move a result across a rounding boundary."""
    torch.manual_seed(2)
    hidden, delta, weight = torch.randn(64, 576) * 3, torch.randn(64, 576).bfloat16(), torch.randn(576)
    expected = F.rms_norm(hidden + delta, (576,), weight, 1e-5).to(torch.bfloat16)
    stream, out = hidden.clone(), torch.empty(64, 576, dtype=torch.bfloat16)
    cpu_fused.rms_norm(stream.numpy(), weight.numpy(), 1e-5, kernel_array(out), kernel_array(delta))
    assert torch.equal(stream, hidden + delta)
    apart = (out.view(torch.int16).int() - expected.view(torch.int16).int()).abs()
    assert apart.max() <= 1 and (apart > 0).float().mean() < 1e-3


def test_bfloat16_swiglu_rounds_as_the_torch_ops() -> None:
    """The kernel's own exp differs from torch's in the last float32 bits: at most a rare result lands
    on the other side of a bfloat16 rounding boundary."""
    torch.manual_seed(3)
    gate_up = (torch.randn(64, 2 * 1536) * 4).bfloat16()
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate) * up
    out = torch.empty(64, 1536, dtype=torch.bfloat16)
    cpu_fused.swiglu(kernel_array(gate_up), kernel_array(out))
    apart = (out.view(torch.int16).int() - expected.view(torch.int16).int()).abs()
    assert apart.max() <= 1 and (apart > 0).float().mean() < 1e-4


def scheduled(seq_id: int, tokens: list[int], start: int, table: list[int]) -> ScheduledSequence:
    """Computes `tokens[start:]` of a sequence whose first `start` tokens are cached."""
    return ScheduledSequence(seq_id, tokens[start:], start, table, True, GREEDY, tokens, len(tokens), None)


STEPS = {
    # three prompts of 1, 7 and 13 tokens are in the cache; each step adds to them
    "decodes": lambda prompts, tables: [scheduled(i, [*p, 5 + i], len(p), tables[i]) for i, p in enumerate(prompts)],
    "chunks": lambda prompts, tables: [
        scheduled(0, [*prompts[0], 9, 8, 7], len(prompts[0]), tables[0]),
        scheduled(3, [4] * 9, 0, tables[3]),
    ],
    "mixed": lambda prompts, tables: [
        scheduled(1, [*prompts[1], 6], len(prompts[1]), tables[1]),
        scheduled(2, [*prompts[2], 1, 2, 3, 4], len(prompts[2]), tables[2]),
    ],
}


@pytest.mark.parametrize("kind", STEPS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_step_matches_the_torch_ops(tiny_model, dtype, kind) -> None:
    """The same executor and cache, the step run fused and through the torch ops."""
    executor = TorchExecutor(EngineConfig(model=str(tiny_model)), dtype=dtype, device="cpu", attention="numba")
    assert executor.model.fused is not None
    executor.initialize_cache(64, BLOCK_SIZE)
    rng = random.Random(3)
    prompts = [[rng.randrange(259) for _ in range(length)] for length in (1, 7, 13)]
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(len(prompts) + 1)]
    for i, prompt in enumerate(prompts):
        executor.execute(ExecutionBatch([scheduled(i, prompt, 0, tables[i])], BLOCK_SIZE))
    step = layout(ExecutionBatch(STEPS[kind](prompts, tables), BLOCK_SIZE))
    with torch.inference_mode():
        input_ids, positions, attention, kv_caches, _ = executor.model_inputs(step)
        fused = executor.model.hidden_states(input_ids, positions, attention, kv_caches)
        fused_caches = [(k.clone(), v.clone()) for k, v in kv_caches]
        executor.model.fused = None
        plain = executor.model.hidden_states(input_ids, positions, attention, kv_caches)
    tolerance = (
        dict(atol=1e-6, rtol=1e-4) if dtype == "float32" else dict(atol=1e-3, rtol=1e-2)
    )  # hidden states of order 0.1
    torch.testing.assert_close(fused, plain, **tolerance)
    for (k_fused, v_fused), (k_plain, v_plain) in zip(fused_caches, kv_caches, strict=True):
        torch.testing.assert_close(k_fused.float(), k_plain.float(), **tolerance)
        torch.testing.assert_close(v_fused.float(), v_plain.float(), **tolerance)


@pytest.mark.parametrize(
    "dtype, kv_cache_dtype, fused",
    [("bfloat16", "auto", True), ("float32", "auto", True), ("float32", "bfloat16", False)],
)
def test_fused_steps_need_the_cache_in_the_model_dtype(tiny_model, dtype, kv_cache_dtype, fused) -> None:
    executor = TorchExecutor(
        EngineConfig(model=str(tiny_model)), dtype=dtype, kv_cache_dtype=kv_cache_dtype, device="cpu", attention="numba"
    )
    assert (executor.model.fused is not None) == fused
    assert (
        TorchExecutor(
            EngineConfig(model=str(tiny_model)),
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            device="cpu",
            attention="torch",
        ).model.fused
        is None
    )


@pytest.fixture(scope="module")
def int4_ready_model(tmp_path_factory):
    """The tiny model with an intermediate size of 128."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama-128"), intermediate_size=128)


def decode_step(executor: TorchExecutor, sequences: int, kind: str = "decodes") -> torch.Tensor:
    """Prompts of 1, 7 and 13 tokens prefilled (the first ``sequences``), then a step of ``kind``: the
    residual stream after the last layer, run as the executor runs it."""
    executor.initialize_cache(64, BLOCK_SIZE)
    rng = random.Random(5)
    prompts = [[rng.randrange(259) for _ in range(length)] for length in (1, 7, 13)][:sequences]
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(len(prompts))]
    for i, prompt in enumerate(prompts):
        executor.execute(ExecutionBatch([scheduled(i, prompt, 0, tables[i])], BLOCK_SIZE))
    step = layout(ExecutionBatch(STEPS[kind](prompts, tables), BLOCK_SIZE))
    with torch.inference_mode():
        input_ids, positions, attention, kv_caches, _ = executor.model_inputs(step)
        return executor.model.hidden_states(input_ids, positions, attention, kv_caches)


def int4_executor(model, dtype: str) -> TorchExecutor:
    executor = TorchExecutor(
        EngineConfig(model=str(model)), dtype=dtype, weights="int4", device="cpu", attention="numba"
    )
    if executor.model.fused.packed_rows == 0:
        pytest.skip("no VNNI int4 kernel here (no AVX-512 VNNI, or HETERO_KERNELS_PORTABLE set)")
    return executor


@pytest.mark.parametrize("sequences", [1, 2, 3])
def test_a_layer_in_one_call_computes_its_kernels_calls(int4_ready_model, sequences: int) -> None:
    """float32: a decode step through ``cpu_layer`` (one call per layer) equals the same kernels called one by one."""
    executor = int4_executor(int4_ready_model, "float32")
    assert sequences <= executor.model.fused.packed_rows
    packed = decode_step(executor, sequences)
    executor.model.fused.packed_rows = 0  # the layers' kernels called from Python, one by one
    assert torch.equal(packed, decode_step(executor, sequences))


def test_a_step_verifying_proposals_runs_its_layers_in_one_call(int4_ready_model) -> None:
    """float32: a decode beside a sequence's token and three proposals, each row attending like a decode over
    its sequence up to itself (the proposals' keys written before any row reads them), as the kernels called
    one by one compute it (whose attention over the four rows is the prefill kernel's: float32 rounding)."""
    executor = int4_executor(int4_ready_model, "float32")
    fused = executor.model.fused
    calls = []
    kernel = fused.layer_kernel.decode_layer
    fused.layer_kernel = types.SimpleNamespace(decode_layer=lambda *args: calls.append(kernel(*args)))
    one_call = decode_step(executor, 3, "mixed")
    assert len(calls) == len(executor.model.layers)
    fused.packed_rows = 0
    torch.testing.assert_close(one_call, decode_step(executor, 3, "mixed"), atol=1e-5, rtol=1e-4)


def test_packed_decodes_keep_bfloat16_models_closer_to_float32(int4_ready_model) -> None:
    """The one-call layers keep the activations float32 under a bfloat16 model: nearer the float32 model's
    stream than the same step with every activation rounded to bfloat16."""
    reference = decode_step(int4_executor(int4_ready_model, "float32"), 2)
    executor = int4_executor(int4_ready_model, "bfloat16")
    packed = decode_step(executor, 2)
    executor.model.fused.packed_rows = 0
    rounded = decode_step(executor, 2)
    assert float((packed - reference).abs().mean()) < float((rounded - reference).abs().mean())


@pytest.mark.parametrize("weight_type", ["Q8_0", "Q5_1", "Q6_K"])
def test_8_bit_layers_in_one_call_compute_their_kernels_calls(int4_ready_model, tmp_path, weight_type: str) -> None:
    """A GGUF's 8-bit groups (Q8_0; Q5_1 with its offsets; Q6_K's groups of 16, in a model wide enough
    for its blocks of 256) run in the one-call layer on ``cpu_packed_vnni.matmul``, equal to the same kernels
    called one by one."""
    gguf = pytest.importorskip("gguf")
    model = (
        int4_ready_model
        if weight_type != "Q6_K"
        else write_tiny_model(tmp_path / "wide", hidden_size=256, intermediate_size=256)
    )
    path = write_tiny_gguf(model, tmp_path / "tiny.gguf", gguf.GGMLQuantizationType[weight_type])
    executor = TorchExecutor(
        EngineConfig(model=str(path)), dtype="float32", weights="int4", device="cpu", attention="numba"
    )
    if executor.model.fused.packed_rows == 0:
        pytest.skip("no VNNI kernel here (no AVX-512 VNNI, or HETERO_KERNELS_PORTABLE set)")
    one_call = decode_step(executor, 2)
    executor.model.fused.packed_rows = 0
    assert torch.equal(one_call, decode_step(executor, 2))
