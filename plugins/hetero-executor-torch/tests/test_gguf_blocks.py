"""Every GGUF type with a group form reads back exactly what ``gguf`` dequantizes, and runs packed as it dequantizes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from hetero_executor_torch.gguf_blocks import eight_bit, factor_values, fine_eight_bit, group_form
from hetero_executor_torch.loading import FINE_TYPES, PACKED_TYPES
from hetero_executor_torch.quantized import (
    ByteQuantized,
    DenseLinear,
    GroupQuantized,
    PackedLinear,
    SplitInt4Weights,
    concat,
    fine_groups_run_packed,
    make_linear,
)

from .test_quantized import activation_steps, assert_within

T = gguf.GGMLQuantizationType
CPU = torch.device("cpu")
F16_FIELDS = {  # byte offsets of each block's f16 factors
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.IQ4_NL: (0,),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q2_K: (80, 82),
    T.Q6_K: (208,),
}


def random_blocks(kind: T, rows: int, inputs: int, seed: int) -> np.ndarray:
    """Random valid blocks ``[rows, bytes per row]``: any bytes, but finite f16 factors of ordinary size."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * inputs // block, size), dtype=np.uint8)
    for offset in F16_FIELDS[kind]:
        factors = (rng.standard_normal(blocks.shape[0]) * 0.01).astype(np.float16)
        blocks[:, offset : offset + 2] = factors.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def reference(raw: np.ndarray, kind: T) -> np.ndarray:
    return gguf.quants.dequantize(raw, kind).astype(np.float32)


@pytest.mark.parametrize("kind", sorted(PACKED_TYPES | FINE_TYPES), ids=lambda k: k.name)
def test_each_packed_type_reads_back_exactly_what_gguf_dequantizes(kind: T) -> None:
    raw = random_blocks(kind, rows=4, inputs=512, seed=int(kind))
    expected = reference(raw, kind)
    eight, fine = eight_bit(raw, kind), fine_eight_bit(raw, kind)
    for values, size in ((eight, 32), (fine, 16)):
        if values is not None:  # the 8-bit values and factors are exact
            q, scale, offset = (np.ascontiguousarray(factor_values(a)).reshape(4, -1) for a in values)
            widened = q.astype(np.float32) * np.repeat(scale, size, axis=1) + np.repeat(offset, size, axis=1)
            np.testing.assert_array_equal(widened, expected)
    form = group_form(raw, kind)
    assert isinstance(form, GroupQuantized if eight is None and fine is None else ByteQuantized)
    if isinstance(form, ByteQuantized):
        assert form.group_size == (16 if fine is not None else 32)
    np.testing.assert_array_equal(form.dequantize().numpy(), expected)


def test_a_type_with_no_group_form_has_none() -> None:
    assert group_form(np.zeros((2, gguf.GGML_QUANT_SIZES[T.Q8_K][1]), np.uint8), T.Q8_K) is None


@pytest.mark.parametrize("rows", [1, 2, 3, 9])
@pytest.mark.parametrize("kind", sorted(PACKED_TYPES | FINE_TYPES), ids=lambda k: k.name)
def test_each_packed_type_runs_as_it_dequantizes(kind: T, rows: int) -> None:
    """float32 activations: whichever kernel this CPU runs reproduces the dequantized float32 matmul
    (up to the VNNI kernels' 16-bit activation steps); groups of 16 run dense where that kernel does not."""
    raw = random_blocks(kind, rows=48, inputs=512, seed=int(kind) + 100)
    dense = torch.from_numpy(reference(raw, kind))
    linear = make_linear(group_form(raw, kind), None, "auto", torch.float32, CPU)
    assert isinstance(linear, PackedLinear if kind not in FINE_TYPES or fine_groups_run_packed() else DenseLinear)
    x = torch.randn(rows, dense.shape[1], generator=torch.Generator().manual_seed(rows))
    assert_within(linear(x), x @ dense.T, activation_steps(x, dense, 32639), 1e-5)


@pytest.mark.parametrize(
    "kind",
    sorted(k for k in PACKED_TYPES if eight_bit(random_blocks(k, 1, 256, 0), k) is not None),
    ids=lambda k: k.name,
)
def test_each_8_bit_type_runs_on_torchs_int4_kernel_as_two_halves(kind: T) -> None:
    """The path of CPUs without AVX-512 VNNI: torch's packed int4 kernel on the two 4-bit halves."""
    raw = random_blocks(kind, rows=48, inputs=512, seed=int(kind) + 200)
    dense = torch.from_numpy(reference(raw, kind))
    x = torch.randn(1, dense.shape[1], generator=torch.Generator().manual_seed(0))
    halves = SplitInt4Weights(group_form(raw, kind), torch.float32)
    torch.testing.assert_close(halves.matmul(x), x @ dense.T, rtol=1e-4, atol=1e-4 * float(dense.abs().max()))


@pytest.mark.parametrize(
    ("kinds", "group_size"),
    [((T.Q5_0, T.Q4_K, T.Q8_0), 32), ((T.Q5_0, T.Q4_K, T.Q6_K), 16)],
    ids=["beside 8-bit", "beside groups of 16"],
)
def test_parts_of_a_projection_join_exactly_in_the_finest_form(kinds: tuple[T, ...], group_size: int) -> None:
    """As a Q4_K_M file's fused projections do: a Q4_K part beside Q5_0 ones (8-bit groups of 32), and
    Q5_0 q and k beside a Q6_K v (groups of 16)."""
    parts = [group_form(random_blocks(kind, 16, 256, i), kind) for i, kind in enumerate(kinds)]
    joined = concat(parts)
    assert isinstance(joined, ByteQuantized) and joined.group_size == group_size
    expected = torch.cat([p.dequantize() for p in parts])
    torch.testing.assert_close(joined.dequantize(), expected, rtol=1e-6, atol=1e-6 * float(expected.abs().max()))


K_QUANTS = sorted({T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K})


@pytest.mark.parametrize("kind", K_QUANTS, ids=lambda k: k.name)
def test_k_quants_keep_their_super_block_codes_and_pack_them(kind: T) -> None:
    """The codes give the factors exactly; packed, they stay codes (a byte each, a float16 base per 256 inputs)."""
    form = group_form(random_blocks(kind, rows=16, inputs=512, seed=int(kind) + 300), kind)
    second = form.minimum if isinstance(form, GroupQuantized) else form.offset
    for codes, values in zip(form.codes, (form.scale, second), strict=True):
        torch.testing.assert_close(codes.values(), values, rtol=0, atol=0)
    if fine_groups_run_packed():
        linear = make_linear(form, None, "auto", torch.float32, CPU)
        assert linear.rows.factors.dtype == np.int8


def test_k_quant_parts_join_with_their_codes_and_others_without() -> None:
    q4_k, q6_k, q5_0 = (group_form(random_blocks(kind, 16, 256, 7), kind) for kind in (T.Q4_K, T.Q6_K, T.Q5_0))
    joined = concat([q4_k, q6_k])
    assert joined.codes is not None and joined.group_size == 16
    torch.testing.assert_close(joined.codes[0].values(), joined.scale, rtol=0, atol=0)
    torch.testing.assert_close(joined.codes[1].values(), joined.offset, rtol=0, atol=0)
    assert concat([q4_k, q5_0]).codes is None


PACKED_BYTES = {  # bytes a weight each type keeps packed: the kernels' README's table
    T.Q4_0: 0.625,
    T.Q4_1: 0.625,
    T.Q4_K: 0.578,
    T.Q5_0: 0.875,
    T.Q5_1: 1.0,
    T.Q5_K: 0.828,
    T.Q6_K: 0.891,
    T.Q2_K: 0.891,
    T.Q8_0: 1.125,
    T.IQ4_NL: 1.125,
    T.Q3_K: 1.078,
}


@pytest.mark.skipif(not fine_groups_run_packed(), reason="hetero_kernels is not installed: nothing is packed")
@pytest.mark.parametrize("kind", sorted(PACKED_BYTES), ids=lambda k: k.name)
def test_each_type_keeps_the_bytes_a_weight_the_kernels_readme_gives(kind: T) -> None:
    """5-bit and 6-bit types in 6 bits, K-quants' factors as codes."""
    linear = make_linear(
        group_form(random_blocks(kind, 32, 512, int(kind) + 400), kind), None, "auto", torch.float32, CPU
    )
    held = linear.rows.packed.nbytes + linear.rows.factors.nbytes
    assert round(held / (32 * 512), 3) == PACKED_BYTES[kind]
