"""The AVX-512 VNNI packed matmul against its portable twin: the same integer sums, float32 additions in another
order."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import example, given, settings
from packed_problems import PADDED, Spec, Weights, specs, term_magnitudes, with_two_signatures

from hetero_kernels import cpu_packed, cpu_packed_vnni
from hetero_kernels.dtypes import bfloat16_bits, widen

pytestmark = pytest.mark.skipif(
    not cpu_packed_vnni.SUPPORTED,
    reason="this CPU has no AVX-512 VNNI, Numba does not compile for it,"
    " or HETERO_KERNELS_PORTABLE forces the portable paths",
)
CHUNKS = attrs.evolve(PADDED, tokens=7)
"""Seven activation rows: one chunk each of four, two and one, over a padded last block."""


def reassociation(x: np.ndarray, weights: Weights) -> np.ndarray:
    """How far the two kernels' float32 results may be apart: both add the same two float32 terms per group
    (from the same integer sums, steps and factors), in another order and with other fused multiply-adds,
    each within a rounding per term and one per addition of the terms' exact sum, so twice that, with room for
    the products' own roundings: (4 * groups + 4) float32 roundings of the terms' magnitudes."""
    groups = x.shape[1] // weights.group
    return (4 * groups + 4) * 2.0**-24 * term_magnitudes(x, weights)


def run(matmul, x: np.ndarray, weights: Weights, dtype) -> np.ndarray:
    out = np.empty((x.shape[0], weights.q.shape[0]), dtype)
    matmul(x, weights.packed, weights.factors, out)
    return out


@settings(max_examples=40, deadline=None)
@given(spec=specs(max_tokens=20))
@example(spec=CHUNKS)
@example(spec=attrs.evolve(CHUNKS, bits=4, group=32, with_offset=False))
@example(spec=attrs.evolve(CHUNKS, narrow=True))
def test_float32_results_equal_the_portable_ones_up_to_float32_reassociation(spec: Spec) -> None:
    x, weights = spec.build()
    portable = run(cpu_packed.matmul, x, weights, np.float32)
    vnni = run(cpu_packed_vnni.matmul, x, weights, np.float32)
    assert np.all(np.abs(vnni.astype(np.float64) - portable) <= reassociation(x, weights))


@settings(max_examples=20, deadline=None)
@given(spec=specs(max_tokens=20))
@example(spec=CHUNKS)
def test_bfloat16_results_are_the_portable_ones_up_to_one_bfloat16_step_and_reassociation(spec: Spec) -> None:
    """Each kernel rounds its own float32 total to nearest even; totals a float32 reassociation apart round to
    bfloat16 numbers one bfloat16 step apart at most, and further only by that reassociation, where the sum
    cancels to far below its terms (an 8-bit row's ``q + 128`` terms do)."""
    x, weights = with_two_signatures(spec).build()
    bits = bfloat16_bits(x)
    vnni_bits = run(cpu_packed_vnni.matmul, bits, weights, np.uint16)
    np.testing.assert_array_equal(
        vnni_bits, bfloat16_bits(run(cpu_packed_vnni.matmul, widen(bits).astype(np.float32), weights, np.float32))
    )
    portable, vnni = widen(run(cpu_packed.matmul, bits, weights, np.uint16)), widen(vnni_bits)
    one_step = np.spacing(np.maximum(np.abs(portable), np.abs(vnni)).astype(np.float32)).astype(np.float64) * 2**16
    assert np.all(np.abs(vnni - portable) <= one_step + reassociation(widen(bits), weights))
