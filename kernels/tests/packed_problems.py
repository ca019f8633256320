"""Hypothesis strategies for the packed-weight matmul tests (``hetero_kernels.cpu_packed``).

A drawn :class:`Spec` names the shape (activation rows, output rows so that
the last block of sixteen is often padded, input sizes in whole groups of
32), the weight form (4-bit, or 8-bit in groups of 32 or 16 with or without
an offset), how the factors come (float32 numbers; float16 ones, packed as
float16 bits as GGUF's legacy types store them; or :class:`~hetero_kernels.cpu_packed.Coded`
ones, a float16 base per 256 inputs times a byte per group, as its K-quants
store them) and the activations' magnitude; values come from a
drawn seed, so a failure shrinks to a small spec that names its case. Every
problem's activations hold an all-zero group and one outlier.
"""

from __future__ import annotations

import attrs
import numpy as np
from hypothesis import strategies as st

from hetero_kernels import cpu_packed

GROUP = cpu_packed.GROUP_SIZE
FORMS = [(4, GROUP), (8, GROUP), (8, cpu_packed.FINE_GROUP_SIZE)]  # (bits, inputs a group)
FACTORS = ("float32", "float16", "coded")
SUPER = cpu_packed.SUPER_SIZE


@attrs.frozen
class Weights:
    """Weights as the file holds them, packed, with each one's exact value."""

    bits: int
    group: int
    bias: int  # what the kernels add to q: 128 for 8-bit weights stored whole, 32 for those stored in 6 bits
    q: np.ndarray  # [out, in]: uint8 0..15 or int8
    scale: np.ndarray  # [out, in // group] float32
    minimum: np.ndarray  # [out, in // group] float32: what the packed form adds (cpu_packed's docstring)
    exact: np.ndarray  # [out, in] float64: scale * q + minimum (4-bit), scale * q + offset (8-bit)
    packed: np.ndarray
    factors: np.ndarray

    def per_input(self, values: np.ndarray) -> np.ndarray:
        """Per-group ``values`` [out, in // group] repeated over their groups' inputs."""
        return np.repeat(values, self.group, axis=1)

    def multiplied(self) -> np.ndarray:
        """``q`` as the kernels multiply it (8-bit ones as ``q + 128``, or ``q + 32`` in 6 bits), float64 [out, in]."""
        return self.q.astype(np.float64) + self.bias


def coded(rng: np.random.Generator, rows: int, size: int, group: int, largest: float, codes: tuple[int, int]):
    """K-quant-like factors: a float16 base per 256 inputs (up to ``largest`` / 64) times codes drawn from
    ``codes`` (inclusive)."""
    base = (rng.random((rows, size // SUPER)) * largest / 64).astype(np.float16).astype(np.float32)
    return cpu_packed.Coded(base, rng.integers(codes[0], codes[1] + 1, (rows, size // group)).astype(np.int8))


def bytes_of(rng: np.random.Generator, rows: int, size: int, group: int, narrow: bool) -> np.ndarray:
    """8-bit ``q`` in -128..127, or -32..31 where ``narrow`` (stored in 6 bits), both ends included."""
    low, high = (-cpu_packed.NARROW, cpu_packed.NARROW - 1) if narrow else (-128, 127)
    q = rng.integers(low, high + 1, (rows, size)).astype(np.int8)
    q[0, :group], q[-1, -group:] = low, high
    return q


def weights_of(
    rng: np.random.Generator,
    rows: int,
    size: int,
    bits: int,
    group: int,
    with_offset: bool,
    factors: str,
    narrow: bool = False,
) -> Weights:
    """Random weights of one form: 4-bit ``scale * q + minimum`` (Q4_1's, Q4_K's), or 8-bit ``scale * q``
    (Q8_0's; Q5_0's and Q6_K's where ``narrow``) plus an offset per group where ``with_offset`` (Q5_1's,
    Q5_K's); factors as ``factors`` names (:data:`FACTORS`)."""
    if factors == "coded":
        return coded_weights_of(rng, rows, size, bits, group, with_offset, narrow)
    scale = (rng.random((rows, size // group)) * 0.02).astype(np.float32)
    if bits == 4:
        q = rng.integers(0, 16, (rows, size)).astype(np.uint8)
        offset = (-8 * scale + rng.standard_normal(scale.shape) * 0.002).astype(np.float32)
    else:
        q = bytes_of(rng, rows, size, group, narrow)
        offset = (rng.standard_normal(scale.shape) * 0.01).astype(np.float32) if with_offset else None
    if factors == "float16":
        scale = scale.astype(np.float16).astype(np.float32)
        offset = None if offset is None else offset.astype(np.float16).astype(np.float32)
    return packed_weights(bits, group, q, scale, offset)


def coded_weights_of(
    rng: np.random.Generator, rows: int, size: int, bits: int, group: int, with_offset: bool, narrow: bool
) -> Weights:
    """Q4_K-like (6-bit scale and minimum codes, negative minimum bases), Q5_K-like (8-bit with an offset)
    or Q6_K-like (8-bit, signed scale codes) weights, ``q`` narrow or not."""
    if bits == 4:
        q = rng.integers(0, 16, (rows, size)).astype(np.uint8)
        scale, minimum = coded(rng, rows, size, group, 0.02, (0, 63)), coded(rng, rows, size, group, 0.16, (0, 63))
        return packed_weights(bits, group, q, scale, cpu_packed.Coded(-minimum.base, minimum.codes))
    q = bytes_of(rng, rows, size, group, narrow)
    if with_offset:
        return packed_weights(
            bits, group, q, coded(rng, rows, size, group, 0.02, (0, 63)), coded(rng, rows, size, group, 1.0, (-32, 31))
        )
    return packed_weights(bits, group, q, coded(rng, rows, size, group, 0.02, (-128, 127)), None)


def packed_weights(bits: int, group: int, q: np.ndarray, scale, offset) -> Weights:
    """``q`` with its factors (arrays or :class:`~hetero_kernels.cpu_packed.Coded`) packed, and each weight's value."""
    if bits == 4:
        packed, factors = cpu_packed.pack4(q, scale, offset)
    else:
        packed, factors = cpu_packed.pack8(q, scale, offset)
    scale, offset = (f.values() if isinstance(f, cpu_packed.Coded) else f for f in (scale, offset))
    added = np.zeros_like(scale) if offset is None else offset
    bias = cpu_packed.BIASES[cpu_packed.form_of(packed.dtype == np.uint8, packed.shape[2])[0]]
    minimum = np.float32(-bias) * scale + added if bias else added
    exact = np.repeat(scale.astype(np.float64), group, axis=1) * q + np.repeat(added, group, axis=1)
    return Weights(bits, group, bias, q, scale, minimum, exact, packed, factors)


def activations(rng: np.random.Generator, tokens: int, size: int, magnitude: float) -> np.ndarray:
    """float32 rows of about ``magnitude``; the first row's first group all zero, the last input 1e4 times larger."""
    x = (rng.standard_normal((tokens, size)) * magnitude).astype(np.float32)
    x[0, :GROUP] = 0
    x[-1, -1] *= 1e4
    return x


@attrs.frozen
class Spec:
    tokens: int
    rows: int
    size: int
    bits: int
    group: int
    with_offset: bool
    factors: str
    narrow: bool  # 8-bit q in -32..31, stored in 6 bits
    magnitude: float
    seed: int

    def build(self) -> tuple[np.ndarray, Weights]:
        rng = np.random.default_rng(self.seed)
        weights = weights_of(
            rng, self.rows, self.size, self.bits, self.group, self.with_offset, self.factors, self.narrow
        )
        return activations(rng, self.tokens, self.size, self.magnitude), weights


PADDED = Spec(
    tokens=1,
    rows=40,
    size=96,
    bits=8,
    group=16,
    with_offset=True,
    factors="float32",
    narrow=False,
    magnitude=1.0,
    seed=0,
)
"""8-bit groups of 16 with offsets over a padded last block: the kernels' examples, their rows set as each needs."""


@st.composite
def specs(draw: st.DrawFn, max_tokens: int) -> Spec:
    bits, group = draw(st.sampled_from(FORMS))
    factors = draw(st.sampled_from(FACTORS))
    return Spec(
        tokens=draw(st.integers(1, max_tokens)),
        rows=draw(st.integers(1, 40)),
        size=SUPER * draw(st.integers(1, 2)) if factors == "coded" else GROUP * draw(st.integers(1, 8)),
        bits=bits,
        group=group,
        with_offset=bits == 8 and draw(st.booleans()),
        factors=factors,
        narrow=bits == 8 and draw(st.booleans()),
        magnitude=draw(st.sampled_from([1e-3, 1.0, 300.0])),
        seed=draw(st.integers(0, 2**16)),
    )


def term_magnitudes(x: np.ndarray, weights: Weights) -> np.ndarray:
    """[T, out]: the sum over groups of the magnitudes of the two float32 terms the kernels add per group,
    ``scale * step * sum(q * v)`` and ``minimum * step * sum(v)`` (with ``|step * v|`` at most ``|x|``
    plus a step): what float32 rounding of the sums scales with. 8-bit weights multiply ``q + 128``, so
    their terms outgrow the result."""
    x = np.abs(x.astype(np.float64))
    step = np.repeat(x.reshape(x.shape[0], -1, GROUP).max(-1) / cpu_packed.LIMIT, GROUP, axis=1)
    multiplied = weights.per_input(np.abs(weights.scale)) * weights.multiplied()
    return (x + step) @ (multiplied + weights.per_input(np.abs(weights.minimum))).T


def with_two_signatures(spec: Spec) -> Spec:
    """``spec`` with 4-bit weights' factors float16 bits and 8-bit ones' float32 (an offset makes them so): the
    bfloat16 tests take these two of the six compiled weight and factor dtypes, since bfloat16 changes only
    how activations are read and outputs written, and each signature costs seconds to compile."""
    size = spec.size if spec.factors != "coded" else GROUP * (spec.size // SUPER)
    return attrs.evolve(
        spec, factors="float16" if spec.bits == 4 else "float32", with_offset=spec.bits == 8, size=size, narrow=False
    )
