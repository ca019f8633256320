"""GGUF's quantized blocks read as groups of 32 (or 16) weights, exactly, for the packed kernels.

Every type here stores, per group of 32 (or 16) consecutive inputs of a row,
whole numbers and at most two float factors that a group shares, so it maps
without rounding onto one of the two forms the packed linear layers run:

- 4-bit (:class:`~hetero_executor_torch.quantized.GroupQuantized`,
  ``w = scale * q + minimum``, ``q`` 0..15): Q4_0, Q4_1, and Q4_K, whose
  256-weight super-block holds eight groups of 32 with 6-bit scale and
  minimum codes (``scale = d * sc``, ``minimum = -dmin * m``);
- 8-bit (:class:`~hetero_executor_torch.quantized.ByteQuantized`,
  ``w = scale * q + offset``, ``q`` -128..127), in groups of 32: Q8_0; Q5_0 (``q - 16``),
  Q5_1 and Q5_K (``q`` 0..31 and an offset); IQ4_NL (``q`` from its
  16-entry table); Q3_K, whose two 16-weight halves of a group have their
  own 6-bit scales: ``(sc - 32) * q3`` lies in -124..128, stored as that
  less one with ``offset = d``;
- 8-bit in groups of 16: Q6_K (``q - 32``, ``scale = d * sc`` with its
  signed 8-bit ``sc``) and Q2_K (``q`` 0..3, ``scale = d * (sc & 15)``,
  ``offset = -dmin * (sc >> 4)``), whose scales change every 16 inputs.

The K-quants' factors are returned as :class:`SuperBlocks` (the super-block's
f16 factor and each group's code), which the packed layout keeps as they are.

Any other type returns None here and loads dense.

Layouts, bytes per block (``gguf.quants`` is the reference for each):

==========  =====  ===============================================================
type        bytes  fields in order
==========  =====  ===============================================================
Q4_0        18     f16 d; 16 bytes: low nibble input j, high nibble j + 16
Q4_1        20     f16 d, f16 m; nibbles as Q4_0
Q5_0        22     f16 d; u32 fifth bits (bit j: input j); nibbles as Q4_0
Q5_1        24     f16 d, f16 m; u32 fifth bits; nibbles
Q8_0        34     f16 d; 32 int8
IQ4_NL      18     f16 d; nibbles as Q4_0, indices into the table
Q4_K        144    f16 d, f16 dmin; 12 bytes of 6-bit codes; 128 bytes: chunk c of
                   32 bytes holds group 2c in its low and 2c + 1 in its high nibbles
Q5_K        176    as Q4_K, with 32 bytes of fifth bits (bit g of byte l: input l
                   of group g) before the nibbles
Q3_K        110    32 bytes of high bits (bit k of byte l: input 32k + l); 64 bytes
                   of 2-bit values (chunk c of 32 bytes, shift 2s: input 128c +
                   32s + l); 12 bytes of 6-bit codes; f16 d
Q6_K        210    128 bytes of low nibbles (chunk c of 64 bytes, shift 4s: input
                   128c + 64s + l); 64 bytes of high 2 bits (chunk c of 32 bytes,
                   shift 2s: input 128c + 32s + l); 16 int8 scales; f16 d
Q2_K        84     16 bytes of codes (low nibble scale, high nibble minimum); 64
                   bytes of 2-bit values laid out as Q3_K's; f16 d, f16 dmin
==========  =====  ===============================================================
"""

from __future__ import annotations

from typing import NamedTuple

import gguf
import numpy as np
import torch

from hetero_executor_torch.quantized import GROUP_SIZE, ByteQuantized, Codes, GroupQuantized

T = gguf.GGMLQuantizationType
IQ4_NL_VALUES = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.int8)


class SuperBlocks(NamedTuple):
    """A K-quant's group factors, ``base * code``: each super-block's f16 factor (float32 ``[blocks, 1]``)
    and its groups' codes (int8 ``[blocks, groups]``)."""

    base: np.ndarray
    codes: np.ndarray

    def values(self) -> np.ndarray:
        """float32 ``[blocks, groups]``, each factor one product, as ``gguf.quants`` computes it."""
        return self.base * self.codes.astype(np.float32)


Factor = np.ndarray | SuperBlocks


def factor_values(factor: Factor) -> np.ndarray:
    return factor.values() if isinstance(factor, SuperBlocks) else factor


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The f16 at byte ``offset`` of every block (rows of raw bytes), as float32 ``[blocks, 1]``."""
    return blocks[:, offset : offset + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """16 bytes per group: low nibbles are inputs 0..15, high nibbles 16..31."""
    return np.concatenate([packed & 15, packed >> 4], axis=-1)


def _fifth_bits(words: np.ndarray) -> np.ndarray:
    """A u32 per group (4 bytes) as each input's fifth bit, 0 or 16."""
    bits = words.copy().view("<u4")
    return (((bits >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _k_nibbles(packed: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K's 128 bytes as eight groups of 32: chunk c's low nibbles, then its high ones
    (written in place, half the passes of broadcasting)."""
    out = np.empty((packed.shape[0], 4, 2, 32), np.uint8)
    chunks = packed.reshape(-1, 4, 32)
    np.bitwise_and(chunks, 15, out=out[:, :, 0])
    np.right_shift(chunks, 4, out=out[:, :, 1])
    return out.reshape(-1, 8, 32)


def group_form(data: np.ndarray, kind: T) -> GroupQuantized | ByteQuantized | None:
    """A tensor's raw blocks (``[rows, bytes per row]``) in its exact group form, or None where it has none."""
    rows = data.shape[0]

    def tensor(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array).reshape(rows, -1))

    def quantized(cls: type, q: np.ndarray, scale: Factor, second: Factor) -> GroupQuantized | ByteQuantized:
        codes = None
        if isinstance(scale, SuperBlocks) and isinstance(second, SuperBlocks):
            codes = tuple(Codes(tensor(f.base), tensor(f.codes)) for f in (scale, second))
        return cls(tensor(q), tensor(factor_values(scale)), tensor(factor_values(second)), codes)

    four = _four_bit(data, kind)
    if four is not None:
        return quantized(GroupQuantized, *four)
    eight = eight_bit(data, kind)
    if eight is None:
        eight = fine_eight_bit(data, kind)
    return None if eight is None else quantized(ByteQuantized, *eight)


def _four_bit(data: np.ndarray, kind: T) -> tuple[np.ndarray, Factor, Factor] | None:
    """``(q, scale, minimum)``, ``q`` 0..15 per input, the factors per group of 32."""
    if kind in (T.Q4_0, T.Q4_1):
        header = 4 if kind == T.Q4_1 else 2
        blocks = data.reshape(-1, header + GROUP_SIZE // 2)
        scale = _f16(blocks, 0)
        minimum = _f16(blocks, 2) if kind == T.Q4_1 else -8 * scale
        return _nibbles(blocks[:, header:]), scale, minimum
    if kind == T.Q4_K:
        blocks = data.reshape(-1, 144)
        return _k_nibbles(blocks[:, 16:]), *_k_factors(blocks)
    return None


def _k_factors(blocks: np.ndarray) -> tuple[SuperBlocks, SuperBlocks]:
    """Q4_K's and Q5_K's scales ``d * sc`` and minimums ``-dmin * m``, from their 6-bit codes."""
    codes, mins = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16])
    return SuperBlocks(_f16(blocks, 0), codes.astype(np.int8)), SuperBlocks(-_f16(blocks, 2), mins.astype(np.int8))


def eight_bit(data: np.ndarray, kind: T) -> tuple[np.ndarray, Factor, Factor] | None:
    """``(q, scale, offset)``: ``q`` int8 per input, ``w = scale * q + offset`` with the factors per group
    of 32 (``[groups, 1]``, or ``[blocks, 8]`` for the 256-weight types); None for other types."""
    if kind == T.Q8_0:
        blocks = data.reshape(-1, 34)
        scale = _f16(blocks, 0)
        return blocks[:, 2:].copy().view(np.int8), scale, np.zeros_like(scale)
    if kind in (T.Q5_0, T.Q5_1):
        header = 6 if kind == T.Q5_0 else 8
        blocks = data.reshape(-1, header + GROUP_SIZE // 2)
        q = (_nibbles(blocks[:, header:]) | _fifth_bits(blocks[:, header - 4 : header])).astype(np.int8)
        scale = _f16(blocks, 0)
        if kind == T.Q5_0:
            return q - np.int8(16), scale, np.zeros_like(scale)
        return q, scale, _f16(blocks, 2)
    if kind == T.IQ4_NL:
        blocks = data.reshape(-1, 18)
        scale = _f16(blocks, 0)
        return IQ4_NL_VALUES[_nibbles(blocks[:, 2:])], scale, np.zeros_like(scale)
    if kind == T.Q5_K:
        blocks = data.reshape(-1, 176)
        fifth = ((blocks[:, None, 16:48] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 4
        q = (_k_nibbles(blocks[:, 48:]) | fifth).astype(np.int8)
        return q, *_k_factors(blocks)
    if kind == T.Q3_K:
        blocks = data.reshape(-1, 110)
        high = (blocks[:, None, :32] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
        q3 = _two_bit(blocks[:, 32:96]).astype(np.int16) - 4 * (1 - high.reshape(-1, 256).astype(np.int16))
        scales = _q3_k_scales(blocks[:, 96:108])  # [blocks, 16], -32..31
        value = np.repeat(scales, 16, axis=1) * q3  # -124..128
        scale = SuperBlocks(_f16(blocks, 108), np.ones((blocks.shape[0], 8), np.int8))
        return (value - 1).astype(np.int8), scale, scale
    return None


def _q3_k_scales(codes: np.ndarray) -> np.ndarray:
    """Q3_K's twelve bytes of codes as sixteen 6-bit scales less 32: the low four bits of scale i from
    byte i % 8 (shifted by 4 for i >= 8), the high two from byte 8 + i % 4, shifted by 2 * (i // 4)."""
    low = (codes[:, None, :8] >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(-1, 16) & 15
    high = (codes[:, None, 8:12] >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(-1, 16) & 3
    return (low | (high << 4)).astype(np.int16) - 32


def _two_bit(packed: np.ndarray) -> np.ndarray:
    """Q2_K's and Q3_K's 64 bytes of 2-bit values (and Q6_K's high bits) as 256 inputs: chunk c of 32
    bytes, shift 2s, is inputs 128c + 32s .. + 31."""
    return ((packed.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3).reshape(
        -1, 256
    )


def fine_eight_bit(data: np.ndarray, kind: T) -> tuple[np.ndarray, Factor, Factor] | None:
    """``(q, scale, offset)``: ``q`` int8 per input, ``w = scale * q + offset`` with the factors per group
    of 16 (``[blocks, 16]``); None for types other than Q6_K and Q2_K."""
    if kind == T.Q6_K:
        blocks = data.reshape(-1, 210)
        q = np.empty((blocks.shape[0], 2, 4, 32), np.uint8)  # chunk c, slice s: inputs 128c + 32s + l
        low = blocks[:, :128].reshape(-1, 2, 2, 32)  # slices 0, 1 in the low nibbles, 2, 3 in the high
        np.bitwise_and(low, 15, out=q[:, :, :2])
        np.right_shift(low, 4, out=q[:, :, 2:])
        q = q.reshape(-1, 256)
        q |= _two_bit(blocks[:, 128:192]) << 4  # the high two bits, laid out as Q3_K's low ones
        signed = q.view(np.int8)
        signed -= 32
        scale = SuperBlocks(_f16(blocks, 208), blocks[:, 192:208].view(np.int8))
        return signed, scale, SuperBlocks(np.zeros_like(scale.base), np.zeros_like(scale.codes))
    if kind == T.Q2_K:
        blocks = data.reshape(-1, 84)
        codes = blocks[:, :16]
        return (
            _two_bit(blocks[:, 16:80]).astype(np.int8),
            SuperBlocks(_f16(blocks, 80), (codes & 15).astype(np.int8)),
            SuperBlocks(-_f16(blocks, 82), (codes >> 4).astype(np.int8)),
        )
    return None
