"""Packed weights compute the linear layer of the weights they hold: GGUF 4-bit and 8-bit blocks,
int4 and int8 quantization."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_core.batch import ExecutionBatch, ScheduledSequence
from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.model_source import resolve_model_path
from hetero_core.params import GenerationParams
from hetero_core.step_layout import layout
from hetero_executor_torch import TorchExecutor
from hetero_executor_torch.gguf_blocks import group_form
from hetero_executor_torch.loading import unpermute, unpermute_weight
from hetero_executor_torch.plugin import TorchExecutorOptions
from hetero_executor_torch.quantized import (
    PACKED_MAX_ROWS,
    SPLIT_MAX_ROWS,
    TILED_FROM_ROWS,
    TORCH_INT4_MAX_ROWS,
    GroupQuantized,
    PackedLinear,
    PackedWeights,
    SplitInt4Weights,
    make_linear,
    onednn_blocked,
    packed_matmul,
    tile_matmul,
)

from .test_tiny_model import our_logits

CPU = torch.device("cpu")
Q4 = [gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1]


def activation_steps(x: torch.Tensor, weights: torch.Tensor, limit: int = 32639) -> torch.Tensor:
    """How far the packed layout's kernels may move each output by quantizing the activations to 16 bits
    per group of 32 (the largest magnitude to ``limit``): half a step per input times its weight (torch's
    kernels take them as they are)."""
    step = x.abs().view(x.shape[0], -1, 32).amax(-1) / limit
    return (step.repeat_interleave(32, dim=1) / 2) @ weights.abs().T


def assert_within(actual: torch.Tensor, expected: torch.Tensor, slack: torch.Tensor, tolerance: float) -> None:
    excess = (actual - expected).abs() - slack - tolerance * (1 + expected.abs())
    assert float(excess.max()) <= 0, f"off by {float(excess.max())} beyond the allowed"


def vnni_here() -> bool:
    """Whether ``hetero_kernels.cpu_packed_vnni`` runs on this CPU (not with the portable paths forced)."""
    kernels = packed_matmul(torch.float32, CPU)
    return kernels is not None and kernels[1]


def uses_vnni(linear: PackedLinear) -> bool:
    return linear.kernel_arrays() is not None


@pytest.mark.parametrize("kind", Q4, ids=lambda k: k.name)
def test_q4_blocks_read_back_exactly_what_gguf_dequantizes(kind) -> None:
    weights = np.random.default_rng(0).normal(size=(6, 96)).astype(np.float32)
    raw = gguf.quants.quantize(weights, kind)
    groups = group_form(raw, kind)
    np.testing.assert_array_equal(groups.dequantize().numpy(), gguf.quants.dequantize(raw, kind))
    assert int(groups.q.max()) <= 15


def test_q8_0_blocks_split_into_two_4_bit_halves_exactly() -> None:
    weights = np.random.default_rng(0).normal(size=(6, 96)).astype(np.float32)
    weights[0, :32] = np.linspace(-1, 1, 32)  # a group using the whole range, -127..127
    raw = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)
    split = group_form(raw, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(
        split.dequantize().numpy(), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)
    )
    high, low = split.halves()
    np.testing.assert_array_equal((high.dequantize() + low.dequantize()).numpy(), split.dequantize().numpy())
    for half in (high, low):
        assert int(half.q.max()) <= 15


@pytest.mark.parametrize("kind", [gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0], ids=lambda k: k.name)
def test_unpermuting_a_quantized_weight_moves_its_rows_like_the_dense_one(kind) -> None:
    raw = gguf.quants.quantize(np.random.default_rng(1).normal(size=(24, 64)).astype(np.float32), kind)
    held = group_form(raw, kind)
    expected = unpermute(held.dequantize().numpy(), 3)
    np.testing.assert_array_equal(unpermute_weight(held, 3).dequantize().numpy(), expected)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 12), out_blocks=st.integers(1, 4), in_groups=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_int4_from_dense_errs_at_most_half_a_step(rows: int, out_blocks: int, in_groups: int, seed: int) -> None:
    weight = torch.randn(out_blocks * 16, in_groups * 32, generator=torch.Generator().manual_seed(seed))
    groups = GroupQuantized.from_dense(weight)
    step = groups.scale.repeat_interleave(32, dim=1)
    assert bool(((groups.dequantize() - weight).abs() <= step / 2 + 1e-6).all())


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "rows",
    sorted({1, 2, 3, 5, TORCH_INT4_MAX_ROWS, TORCH_INT4_MAX_ROWS + 1, PACKED_MAX_ROWS, PACKED_MAX_ROWS + 1}),
)
def test_packed_linear_equals_the_dense_linear_of_its_own_weights(fmt: str, dtype: torch.dtype, rows: int) -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(80, 128) * 0.05, torch.randn(80)
    linear = make_linear(weight, bias.to(dtype), fmt, dtype, CPU)
    assert isinstance(linear, PackedLinear)
    x = torch.randn(rows, 128).to(dtype).float()
    held = linear.dense().float()  # the quantized weights, dequantized
    expected = x @ held.T + bias.to(dtype).float()
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    assert_within(linear(x.to(dtype)).float(), expected, activation_steps(x, held), tolerance)
    step = 1 / 15 if fmt == "int4" else 1 / 127
    assert (
        float((held - weight).abs().max()) <= step * float(weight.abs().max()) * 2
    )  # and those are close to the originals


@pytest.mark.parametrize("rows", [0, 1, 33, 300])
def test_dense_bf16_weights_run_blocked_as_f_linear_runs_them(rows: int) -> None:
    torch.manual_seed(0)
    weight, bias = (torch.randn(80, 96) * 0.05).bfloat16(), torch.randn(80).bfloat16()
    if onednn_blocked(weight) is None:
        pytest.skip("this torch's oneDNN has no bf16 matmul")
    linear = make_linear(weight, bias, "dense", torch.bfloat16, CPU)
    assert linear.weight is None and torch.equal(linear.dense(), weight)  # one copy, blocked
    x = torch.randn(rows + 7, 96).bfloat16()[7:]  # a view, not at the storage's start
    torch.testing.assert_close(linear(x), torch.nn.functional.linear(x, weight, bias))


def test_an_embedding_table_keeps_its_plain_weights_for_lookups() -> None:
    weight = torch.randn(80, 96).bfloat16()
    ids = torch.tensor([0, 5, 79])
    for table in (
        make_linear(weight, None, "dense", torch.bfloat16, CPU, table=True),
        make_linear(weight, None, "dense", torch.float32, CPU),
    ):
        torch.testing.assert_close(table.embed(ids).float(), weight[ids].float())


@pytest.fixture(scope="module")
def smollm2_tensors():
    reader = gguf.GGUFReader(resolve_model_path(None))
    return {t.name: t for t in reader.tensors}


@pytest.mark.model  # the embedded model's weights
@pytest.mark.parametrize("name", ["blk.0.ffn_gate.weight", "blk.7.attn_output.weight", "blk.29.ffn_down.weight"])
def test_the_files_q4_1_weights_run_packed_as_they_dequantize(smollm2_tensors, name: str) -> None:
    """float32 activations: the packed kernel reproduces the dequantized fp32 matmul of the real file's weights."""
    tensor = smollm2_tensors[name]
    assert tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1
    dense = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32))
    linear = make_linear(group_form(tensor.data, tensor.tensor_type), None, "auto", torch.float32, CPU)
    assert uses_vnni(linear) == vnni_here()
    for rows in sorted({1, 2, 3, 5, linear.max_rows}):  # the VNNI kernel's row chunks of 4, 2 and 1
        x = torch.randn(rows, dense.shape[1], generator=torch.Generator().manual_seed(2))
        assert_within(linear(x), x @ dense.T, activation_steps(x, dense), 1e-5)
    torch.testing.assert_close(linear.dense(), dense)


@pytest.mark.model  # the embedded model's weights
def test_the_files_q4_1_weights_run_packed_for_bf16_rows(smollm2_tensors) -> None:
    """bfloat16 activations, up to the packed kernel's rows: the VNNI kernel reproduces the float32 matmul
    of the dequantized weights but for its 16-bit activation steps and rounding the result to bfloat16."""
    if not vnni_here():
        pytest.skip(
            "no VNNI kernel here (no AVX-512 VNNI, or HETERO_KERNELS_PORTABLE set): "
            "torch's int4 kernel rounds its scales to bf16"
        )
    tensor = smollm2_tensors["blk.3.ffn_up.weight"]
    dense = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32))
    linear = make_linear(group_form(tensor.data, tensor.tensor_type), None, "auto", torch.bfloat16, CPU)
    for rows in sorted({1, 3, 9, linear.max_rows} & set(range(1, linear.max_rows + 1))):
        x = torch.randn(rows, dense.shape[1], generator=torch.Generator().manual_seed(rows)).bfloat16()
        expected = x.float() @ dense.T
        out = linear(x)
        assert out.dtype == torch.bfloat16
        # the result's rounding to bfloat16, on top of the activations' steps
        assert_within(out.float(), expected, activation_steps(x.float(), dense), 2**-8)


@pytest.mark.model  # the embedded model's weights
def test_the_files_q4_1_weights_run_on_amx_tiles_for_more_bf16_rows(smollm2_tensors) -> None:
    """Above the VNNI kernel's rows, on a CPU with AMX: the product of the weights widened to bfloat16 (what
    ``dense()`` gives), summed in float32 and rounded to bfloat16."""
    if tile_matmul(torch.bfloat16) is None:
        pytest.skip("no AMX kernel here (no AMX-BF16, or HETERO_KERNELS_PORTABLE set)")
    tensor = smollm2_tensors["blk.3.ffn_up.weight"]
    linear = make_linear(group_form(tensor.data, tensor.tensor_type), None, "auto", torch.bfloat16, CPU)
    assert linear.tiles is not None and linear.max_rows == TILED_FROM_ROWS - 1
    widened = linear.dense().float()
    for rows in (TILED_FROM_ROWS, 16, 71):  # one tile of rows, a whole one, more than a pass sums
        x = torch.randn(rows, widened.shape[1], generator=torch.Generator().manual_seed(rows)).bfloat16()
        expected = x.float() @ widened.T
        summed = widened.shape[1] * 2.0**-24 * (x.float().abs() @ widened.abs().T)
        assert_within(linear(x).float(), expected, summed, 2**-8)


@pytest.mark.model  # the embedded model's weights
@pytest.mark.parametrize("rows", sorted({1, SPLIT_MAX_ROWS + 1, 5}))
def test_the_files_q8_0_head_runs_packed_as_it_dequantizes(smollm2_tensors, rows: int) -> None:
    """The embedding / head table (Q8_0): packed whole for the VNNI kernel, else as two int4 halves for
    torch's kernel, it reproduces its dequantized float32 matmul."""
    tensor = smollm2_tensors["token_embd.weight"]
    assert tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0
    dense = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32))
    linear = make_linear(group_form(tensor.data, tensor.tensor_type), None, "auto", torch.float32, CPU)
    assert isinstance(linear, PackedLinear) and isinstance(linear.packed, (SplitInt4Weights, PackedWeights))
    assert uses_vnni(linear) == vnni_here()
    x = torch.randn(rows, dense.shape[1], generator=torch.Generator().manual_seed(3))
    high, low = group_form(tensor.data, tensor.tensor_type).halves()
    magnitudes = high.dequantize().abs() + low.dequantize().abs()  # at least the weight's, each half quantized alike
    assert_within(linear(x), x @ dense.T, activation_steps(x, magnitudes), 1e-5)
    torch.testing.assert_close(linear.embed(torch.tensor([0, 7, 49151])), dense[[0, 7, 49151]])


def test_weights_option_is_validated(tiny_model) -> None:
    with pytest.raises(ConfigError, match="weights"):
        TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", weights="int3")


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_a_quantized_checkpoint_computes_the_same_function_at_every_batch_size(tiny_model, fmt: str) -> None:
    """Prefill rows run the dense copy of the quantized weights, single decodes the packed kernels: same logits."""
    packed = TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", device="cpu", weights=fmt)
    assert packed.weight_format == fmt and isinstance(packed.model.layers[0].qkv, PackedLinear)
    ids = [5, 17, 99, 3, 250, 40, 41, 7]
    whole = our_logits(packed, ids)
    decoded = torch.cat([one_token_logits(packed, ids[6], 6), one_token_logits(packed, ids[7], 7)])
    torch.testing.assert_close(decoded, whole[6:], atol=1e-4, rtol=1e-4)
    dense = our_logits(
        TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", device="cpu", weights="dense"), ids
    )
    assert float((dense - whole).abs().max()) < 0.25 * float(dense.abs().max())


def one_token_logits(executor: TorchExecutor, token: int, position: int) -> torch.Tensor:
    """A decode of one token after :func:`our_logits` wrote positions 0.. into slots 8.. (blocks 2..),
    through the executor's own attention backend."""
    blocks = list(range(2, 2 + position // 4 + 1))
    sequence = ScheduledSequence(
        0, [token], position, blocks, True, GenerationParams(temperature=0.0), [token] * (position + 1), position, None
    )
    with torch.inference_mode():
        return executor.model.forward(*executor.model_inputs(layout(ExecutionBatch([sequence], 4))))


@pytest.mark.parametrize(
    ("fmt", "amx"), [("int4", False), ("int8", False), ("int4", True)], ids=["int4", "int8", "int4-amx"]
)  # int8 rows have no packed layout for the AMX kernel
@pytest.mark.parametrize("tile_weights", [1 << 20, 16 * 128], ids=["one tile", "tiles of 16 outputs"])
def test_many_rows_run_the_packed_weights_as_the_dense_copy_holds_them(
    monkeypatch, fmt: str, tile_weights: int, amx: bool
) -> None:
    """No dense copy by default: a step of more rows than the packed kernels take runs on the AMX kernel where
    it runs, else widens the weights a tile of outputs at a time, and computes what the opt-in dense copy
    computes."""
    monkeypatch.setattr("hetero_executor_torch.quantized.TILE_WEIGHTS", tile_weights)
    torch.manual_seed(0)
    weight, bias = torch.randn(80, 128) * 0.05, torch.randn(80).bfloat16()
    widened = make_linear(weight, bias, fmt, torch.bfloat16, CPU)
    copied = make_linear(weight, bias, fmt, torch.bfloat16, CPU, dense_copy=True)
    assert widened.dense_linear is None and copied.dense_linear is not None
    if amx and widened.tiles is None:
        pytest.skip("no AMX kernel here (no AMX-BF16, or HETERO_KERNELS_PORTABLE set)")
    if not amx:
        widened.tiles = None
    torch.testing.assert_close(widened.dense(), copied.dense())
    x = torch.randn(widened.max_rows + 5, 128).bfloat16()
    torch.testing.assert_close(widened(x), copied(x), rtol=2e-2, atol=2e-2)
    ids = torch.tensor([0, 17, 79])
    torch.testing.assert_close(widened.embed(ids), copied.dense()[ids])


@pytest.mark.model  # the embedded model's weights
def test_the_embedded_model_holds_no_dense_copy_unless_asked(smollm2_tensors) -> None:
    for dense_copy in (False, True):
        linears = [
            make_linear(
                group_form(smollm2_tensors[name].data, smollm2_tensors[name].tensor_type),
                None,
                "auto",
                torch.bfloat16,
                CPU,
                dense_copy=dense_copy,
            )
            for name in ("blk.0.ffn_gate.weight", "token_embd.weight")
        ]
        assert all((linear.dense_linear is not None) == dense_copy for linear in linears)


def test_dense_copy_option_is_validated(tiny_model) -> None:
    with pytest.raises(ConfigError, match="dense_copy"):
        TorchExecutorOptions(dense_copy=1)
