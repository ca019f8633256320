"""Linear layers whose weights stay quantized in memory (weight-only quantization on the CPU).

A decode step at batch 1 reads every weight once per token, so its speed is
the weights' bytes over the memory bandwidth. Packed weights are read as they
are and widened inside torch's CPU kernels:

- ``int4``: groups of :data:`GROUP_SIZE` input weights share a scale and an
  offset, ``w = scale * q + minimum`` with ``q`` in 0..15 -- exactly GGUF's
  Q4_1 block (Q4_0 is the same with ``minimum = -8 * scale``), so the file's
  weights run without re-quantization. torch's packed kernel
  (``_weight_int4pack_mm_for_cpu``) computes ``(q - 8) * scale + zero``, so
  ``zero = minimum + 8 * scale``; scales and zeros are stored in the
  activations' dtype (bf16 rounds the file's f16 scales, float32 keeps them).
- 8-bit groups (:class:`ByteQuantized`: GGUF's Q8_0 block, ``w = scale * q``
  with ``q`` in -128..127, and the types read into it) run as the sum of two
  such int4 weights, the high and the low nibble of each ``q``
  (:meth:`ByteQuantized.halves`): exact again, twice the int4 work, still far
  fewer bytes than bf16. Groups of 16 (GGUF's Q6_K and Q2_K) run on
  ``hetero_kernels.cpu_packed`` alone (below).
- ``int8``: one symmetric scale per output channel
  (``_weight_int8pack_mm``); offered for dense checkpoints.

Where ``hetero_kernels`` is installed, both forms are also packed in
``hetero_kernels.cpu_packed``'s layout (:class:`PackedWeights`, sixteen output
rows a vector, exact: 8-bit weights that fit in 6 bits stored in 6, the
K-quants' factors as their super-blocks' :class:`Codes`). On a CPU with AVX-512 VNNI that layout alone serves
steps of up to :data:`PACKED_MAX_ROWS` rows (``cpu_packed_vnni``: integer dot
products against the activations quantized to 16 bits per group, the weights
read once for every row); elsewhere torch's int4 kernel serves them where it
takes the weights, and the layout's portable twin where it does not. Steps
of more rows run, for bfloat16 activations on a CPU with AMX, on
``cpu_packed_amx`` (each block of the layout widened in the cache to
bfloat16 tiles, multiplied by sixteen rows a tile product); elsewhere they
widen the layout a tile at a time for a dense matmul (:class:`PackedLinear`).
The executor's ``dense_copy`` holds a dense copy for them instead, in
oneDNN's blocked layout for bf16 (:func:`onednn_blocked`).

Dense weights (a Hugging Face checkpoint in bf16) are quantized at load time:
int4 by each group's min and max, int8 by each row's largest magnitude.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Protocol

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from hetero_executor_torch.kernel_attention import kernel_array

GROUP_SIZE = 32
WEIGHT_FORMATS = ("auto", "dense", "int8", "int4")


SUPER_BLOCK = 256  # the inputs a K-quant super-block spans


@attrs.frozen
class Codes:
    """Group factors as K-quant super-blocks hold them, each ``base * code`` exactly: a base per
    :data:`SUPER_BLOCK` inputs of a row (float16 values) and a signed byte per group."""

    base: torch.Tensor  # [out, in // SUPER_BLOCK] float32
    codes: torch.Tensor  # [out, groups] int8

    def values(self) -> torch.Tensor:
        """The factors, float32 ``[out, groups]``: each one product, as GGUF's dequantization rounds it."""
        per = self.codes.shape[1] // self.base.shape[1]
        return self.base.repeat_interleave(per, dim=1) * self.codes.float()

    def repeated(self, times: int) -> Codes:
        """The same factors for groups ``times`` smaller."""
        return self if times == 1 else Codes(self.base, self.codes.repeat_interleave(times, dim=1))

    @staticmethod
    def cat(parts: list[tuple[Codes, Codes] | None]) -> tuple[Codes, Codes] | None:
        """Parts' codes stacked along the output dimension; None unless every part has them."""
        if any(p is None for p in parts):
            return None
        return tuple(
            Codes(torch.cat([p[i].base for p in parts]), torch.cat([p[i].codes for p in parts])) for i in (0, 1)
        )


@attrs.frozen
class GroupQuantized:
    """Weights ``[out, in]`` stored as ``scale * q + minimum`` per group of 32 along the input dimension;
    ``codes``, where the file has them, are the same scales and minimums as its super-blocks hold them
    (the packed layout keeps those, in a third of the bytes)."""

    q: torch.Tensor  # [out, in] uint8, 0..15
    scale: torch.Tensor  # [out, in // GROUP_SIZE] float32
    minimum: torch.Tensor  # [out, in // GROUP_SIZE] float32
    codes: tuple[Codes, Codes] | None = None  # (scale, minimum)

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def dequantize(self) -> torch.Tensor:
        grouped = self.q.float().view(self.q.shape[0], -1, GROUP_SIZE)
        return (grouped * self.scale[..., None] + self.minimum[..., None]).view(self.q.shape)

    @classmethod
    def from_dense(cls, weight: torch.Tensor) -> GroupQuantized:
        """Asymmetric 4-bit quantization of each group by its min and max (round to nearest)."""
        grouped = weight.float().view(weight.shape[0], -1, GROUP_SIZE)
        low, high = grouped.amin(-1), grouped.amax(-1)
        scale = (high - low) / 15
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = ((grouped - low[..., None]) / safe[..., None]).round().clamp(0, 15).to(torch.uint8)
        return cls(q.view(weight.shape), scale, low)

    @classmethod
    def cat(cls, parts: list[GroupQuantized]) -> GroupQuantized:
        return cls(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.minimum for p in parts]),
            Codes.cat([p.codes for p in parts]),
        )


@attrs.frozen
class ByteQuantized:
    """8-bit weights ``[out, in]`` stored as ``scale * q + offset``, ``q`` in -128..127, with one scale and
    one offset per group of 32 inputs (GGUF's Q8_0, Q5_0, ...) or of 16 (Q6_K, Q2_K); ``codes`` as
    :class:`GroupQuantized`'s."""

    q: torch.Tensor  # [out, in] int8
    scale: torch.Tensor  # [out, groups] float32
    offset: torch.Tensor  # [out, groups] float32
    codes: tuple[Codes, Codes] | None = None  # (scale, offset)

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def group_size(self) -> int:
        return self.q.shape[1] // self.scale.shape[1]

    def dequantize(self) -> torch.Tensor:
        grouped = self.q.float().view(self.q.shape[0], -1, self.group_size)
        return (grouped * self.scale[..., None] + self.offset[..., None]).view(self.q.shape)

    def in_groups_of(self, size: int) -> ByteQuantized:
        """The same weights with factors per ``size`` inputs (a divisor of the group size), exactly."""
        repeats = self.group_size // size
        if repeats == 1:
            return self
        codes = None if self.codes is None else tuple(c.repeated(repeats) for c in self.codes)
        return ByteQuantized(self.q, *(f.repeat_interleave(repeats, dim=1) for f in (self.scale, self.offset)), codes)

    def halves(self) -> tuple[GroupQuantized, GroupQuantized]:
        """Groups of 32 as the sum of two 4-bit weights, exactly: ``q = 16 * high + low``, ``high`` the
        signed high nibble, ``low`` the low one. The parts are offset so that each kernel's partial sum
        stays centred: ``high`` weighs ``16 * scale * high + 8 * scale + offset`` and ``low`` ``scale *
        (low - 8)``; the centring offsets cancel."""
        high = ((self.q >> 4) + 8).to(torch.uint8)  # arithmetic shift: the signed high nibble, then 0..15
        low = (self.q & 15).to(torch.uint8)
        return GroupQuantized(high, 16 * self.scale, self.offset - 120 * self.scale), GroupQuantized(
            low, self.scale, -8 * self.scale
        )

    @classmethod
    def cat(cls, parts: list[ByteQuantized]) -> ByteQuantized:
        return cls(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.offset for p in parts]),
            Codes.cat([p.codes for p in parts]),
        )


Weight = torch.Tensor | GroupQuantized | ByteQuantized


def as_dense(weight: Weight) -> torch.Tensor:
    return weight if isinstance(weight, torch.Tensor) else weight.dequantize()


def as_bytes(weight: GroupQuantized | ByteQuantized) -> ByteQuantized:
    """4-bit groups in the 8-bit form, exactly: ``q`` 0..15 as it is, the minimum as the offset."""
    if isinstance(weight, ByteQuantized):
        return weight
    return ByteQuantized(weight.q.to(torch.int8), weight.scale, weight.minimum, weight.codes)


def concat(parts: list[Weight]) -> Weight:
    """Weights stacked along the output dimension, kept quantized when every part is quantized: 4-bit
    parts beside 8-bit ones (a file mixing types, such as Q4_K_M's) join in the 8-bit form, in the
    smallest group among them."""
    if all(isinstance(p, GroupQuantized) for p in parts):
        return GroupQuantized.cat(parts)
    if all(isinstance(p, (GroupQuantized, ByteQuantized)) for p in parts):
        eight = [as_bytes(p) for p in parts]
        size = min(p.group_size for p in eight)
        return ByteQuantized.cat([p.in_groups_of(size) for p in eight])
    return torch.cat([as_dense(p) for p in parts])


class Linear(Protocol):
    """``y = x @ W.T (+ bias)`` for activations ``x`` [T, in] in the model's dtype; ``embed`` looks rows up."""

    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def embed(self, ids: torch.Tensor) -> torch.Tensor: ...


ONEDNN_ROWS_HINT = 32  # the rows oneDNN picks its blocking for (32, 512 and 4,096 measured alike)


def onednn_blocked(weight: torch.Tensor) -> torch.Tensor | None:
    """bf16 CPU weights reordered once into oneDNN's blocked layout, or None where oneDNN cannot take them.

    ``F.linear`` hands oneDNN plain weights, which it reorders on every call;
    reordered up front they make the bf16 matmul about 1.4x faster from 1 to
    256 rows on SmolLM2's shapes, as fast to 2,048 and 1.2x slower at 4,336
    (``benchmarks/linear.py``), which cost nothing measurable on a whole
    prefill (figures in ``docs/design/2026-11-26-cpu-int4-linear-kernels.md``,
    "The blocked layout for bf16 weights only"). The sums are oneDNN's
    either way.
    """
    usable = (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")  # private ops, the ones inductor uses
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )
    return torch.ops.mkldnn._reorder_linear_weight(weight, ONEDNN_ROWS_HINT) if usable else None


class DenseLinear:
    """Dense weights in the model's dtype: plain for ``F.linear``, or :func:`onednn_blocked` where that
    applies. The plain copy is kept only when the layer is also the embedding table (``table``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, table: bool = False) -> None:
        self.bias = bias
        self.out_features = weight.shape[0]
        self.blocked = onednn_blocked(weight)
        self.weight = weight if table or self.blocked is None else None

    def dense(self) -> torch.Tensor:
        """The weights as a plain tensor."""
        return self.blocked.to_dense() if self.weight is None else self.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocked is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.blocked, self.bias, "none", [None], "")

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)

    def __getstate__(self) -> dict[str, Any]:
        """Plain weights: oneDNN's blocked layout is made again where they are loaded (it depends on the CPU)."""
        return {"weight": self.dense(), "bias": self.bias, "table": self.weight is not None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["weight"], state["bias"], state["table"])


class Int4Weights:
    """Groupwise int4 weights packed for torch's CPU kernel."""

    def __init__(self, weight: GroupQuantized, dtype: torch.dtype) -> None:
        self.packed = torch._convert_weight_to_int4pack_for_cpu(weight.q.to(torch.int32), 1)
        zero = weight.minimum + 8 * weight.scale
        self.scales_and_zeros = torch.stack([weight.scale, zero], dim=-1).transpose(0, 1).contiguous().to(dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, GROUP_SIZE, self.scales_and_zeros)


class PackedWeights:
    """Group-quantized weights in ``hetero_kernels.cpu_packed``'s layout, multiplied by ``multiply`` (the
    VNNI kernel's ``matmul`` or the portable twin's), outputs in the activations' dtype; called with
    output rows and a buffer, it widens those rows into it (a many-row step's tile, an embedding lookup)."""

    def __init__(self, weight: GroupQuantized | ByteQuantized, multiply: Any) -> None:
        from hetero_kernels import cpu_packed

        self.multiply, self.out_features = multiply, weight.shape[0]
        four_bit = isinstance(weight, GroupQuantized)
        if weight.codes is None:
            factors = (weight.scale.float().numpy(), (weight.minimum if four_bit else weight.offset).float().numpy())
        else:
            factors = tuple(cpu_packed.Coded(c.base.numpy(), c.codes.numpy()) for c in weight.codes)
        pack = cpu_packed.pack4 if four_bit else cpu_packed.pack8
        self.packed, self.factors = pack(weight.q.numpy(), *factors)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        self.multiply(kernel_array(x.contiguous()), self.packed, self.factors, kernel_array(out))
        return out

    def __call__(self, indices: np.ndarray, out: torch.Tensor) -> None:
        from hetero_kernels import cpu_packed

        cpu_packed.unpack(self.packed, self.factors, indices, kernel_array(out))

    def columns(self, start: int, out: torch.Tensor) -> None:
        """Output rows ``start ..`` (a multiple of 16) widened as the columns of ``out`` ``[in, width]``
        (``width`` a multiple of 16), as many as it holds or the weights have."""
        from hetero_kernels import cpu_packed

        cpu_packed.unpack_columns(self.packed, self.factors, start // 16, kernel_array(out))


def packed_matmul(dtype: torch.dtype, device: torch.device) -> tuple[Any, bool] | None:
    """``(matmul, vnni)`` for :class:`PackedWeights` on this host: ``hetero_kernels.cpu_packed_vnni``'s where
    it runs (AVX-512 VNNI, float32 or bfloat16 activations), else the portable twin's; None off the CPU,
    for other dtypes, or without ``hetero_kernels``."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return None
    try:
        from hetero_kernels import cpu_packed, cpu_packed_vnni
    except ImportError:
        return None
    return (cpu_packed_vnni.matmul, True) if cpu_packed_vnni.SUPPORTED else (cpu_packed.matmul, False)


class SplitInt4Weights(Int4Weights):
    """:class:`ByteQuantized` weights in groups of 32 as one packed int4 weight twice as wide, the
    high half's groups then the low half's (:meth:`ByteQuantized.halves`), multiplied by the input
    written twice: the kernel sums both halves in its float32 accumulator, in one call (a sixth
    faster than two calls for SmolLM2's head at one row)."""

    def __init__(self, weight: ByteQuantized, dtype: torch.dtype) -> None:
        high, low = weight.halves()
        side_by_side = GroupQuantized(
            torch.cat([high.q, low.q], 1),
            torch.cat([high.scale, low.scale], 1),
            torch.cat([high.minimum, low.minimum], 1),
        )
        super().__init__(side_by_side, dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return super().matmul(torch.cat([x, x], dim=1))


class Int8Weights:
    """Per-output-channel symmetric int8 weights."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        weight = weight.float()
        scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.weight = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        self.scale = scale.to(dtype)

    def dequantize(self) -> torch.Tensor:
        return self.weight.float() * self.scale.float()[:, None]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.weight, self.scale)


class Int8Rows:
    """Rows of :class:`Int8Weights` widened by torch."""

    def __init__(self, weights: Int8Weights) -> None:
        self.weights = weights

    def __call__(self, indices: np.ndarray, out: torch.Tensor) -> None:
        index = torch.from_numpy(indices)
        out.copy_(self.weights.weight[index].float() * self.weights.scale.float()[index, None])

    def columns(self, start: int, out: torch.Tensor) -> None:
        """Output rows ``start ..`` widened as the columns of ``out`` ``[in, width]``."""
        stop = min(start + out.shape[1], self.weights.weight.shape[0])
        rows = self.weights.weight[start:stop].float() * self.weights.scale.float()[start:stop, None]
        out[:, : stop - start].copy_(rows.t())


Rows = PackedWeights | Int8Rows
# weights widened at a time for a matmul of many rows (8 MiB in bf16):
# fewer, larger matmuls measured faster than L2-sized ones
TILE_WEIGHTS = 1 << 22


class PackedLinear:
    """Packed weights for steps of at most ``max_rows`` tokens; above, the layout (``rows``) on the AMX
    kernel (``tiles``, where given, up to :data:`TILED_MAX_ROWS` bfloat16 rows), else widened a tile of
    outputs at a time into a buffer of the model's dtype, multiplied densely -- or, where asked
    (``dense``, the executor's ``dense_copy``) or no widening is at hand, a dense copy.

    The VNNI kernel reads each weight once for all of a step's rows, and its
    cost grows with the rows about as a widening plus oneDNN's dense bf16
    matmul does from about 50 rows, and as the AMX kernel does from about 8
    (``benchmarks/linear.py``); torch's int4 kernel costs linearly in the rows
    from fewer. The widened weights are the packed weights' own values, so a
    model computes the same function at every batch size (up to rounding: the
    VNNI kernel's 16-bit activation steps, torch's kernel's bfloat16 scales,
    the widened weights' bfloat16).
    """

    def __init__(
        self,
        packed: PackedWeights | Int4Weights | SplitInt4Weights | Int8Weights,
        shape: torch.Size,
        dtype: torch.dtype,
        bias: torch.Tensor | None,
        max_rows: int = 0,
        table: bool = False,
        rows: Rows | None = None,
        dense: torch.Tensor | None = None,
        tiles: Any = None,
    ) -> None:
        if rows is None and dense is None:
            raise ValueError("packed weights need a widening (rows) or a dense copy for steps of many rows")
        self.packed, self.bias, self.dtype = packed, bias, dtype
        self.out_features, self.in_features = shape
        self.max_rows = max_rows or PACKED_MAX_ROWS
        self.rows = rows
        self.tiles = tiles if isinstance(rows, PackedWeights) else None
        self.dense_linear = None if dense is None else DenseLinear(dense, bias, table)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.max_rows:
            out = self.packed.matmul(x)
        elif self.dense_linear is not None:
            return self.dense_linear(x)
        elif self.tiles is not None and x.dtype == torch.bfloat16 and x.shape[0] <= TILED_MAX_ROWS:
            out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
            self.tiles(kernel_array(x.contiguous()), self.rows.packed, self.rows.factors, kernel_array(out))
        else:
            out = self._widened(x)
        return out if self.bias is None else out + self.bias

    def unwidened_rows(self) -> int:
        """The most rows a step multiplies without widening the weights (or reading the dense copy)."""
        return TILED_MAX_ROWS if self.tiles is not None and self.dense_linear is None else self.max_rows

    def _widened(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` with ``W`` widened a tile of outputs at a time, transposed (``W.T``'s columns
        are what the widening writes whole)."""
        width = -(-self.out_features // 16) * 16
        tile = min(width, max(16, TILE_WEIGHTS // self.in_features // 16 * 16))
        columns = torch.empty(self.in_features, tile, dtype=x.dtype)
        if tile >= self.out_features:
            self.rows.columns(0, columns)
            out = x @ columns[:, : self.out_features]
        else:
            out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
            for start in range(0, self.out_features, tile):
                stop = min(start + tile, self.out_features)
                self.rows.columns(start, columns)
                out[:, start:stop] = x @ columns[:, : stop - start]
        return out

    def dense(self) -> torch.Tensor:
        """The weights as a plain tensor in the model's dtype."""
        if self.dense_linear is not None:
            return self.dense_linear.dense()
        weights = torch.empty(self.out_features, self.in_features, dtype=self.dtype)
        self.rows(np.arange(self.out_features, dtype=np.int64), weights)
        return weights

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.dense_linear is not None:
            return self.dense_linear.embed(ids)
        out = torch.empty(ids.shape[0], self.in_features, dtype=self.dtype)
        self.rows(ids.to(torch.int64).numpy(), out)
        return out

    def kernel_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The weights as ``hetero_kernels.cpu_packed_vnni.matmul`` takes them, ``(bytes, factors)``, where that
        kernel computes this layer (up to ``max_rows`` rows; no bias to add), else None."""
        from hetero_kernels import cpu_packed_vnni

        on_vnni = isinstance(self.packed, PackedWeights) and self.packed.multiply is cpu_packed_vnni.matmul
        usable = self.bias is None and on_vnni
        return (self.packed.packed, self.packed.factors) if usable else None


PACKED_MAX_ROWS = 32  # the VNNI kernel's; from about 50 a widening and a dense matmul cost less
TILED_FROM_ROWS = 9  # where the AMX kernel serves many rows: from here it costs less than the VNNI kernel
TILED_MAX_ROWS = 256  # and up to here: its rows are read again for every block, so they must stay in cache
TORCH_INT4_MAX_ROWS = 8  # torch's int4 kernel costs linearly in the rows: from here the dense matmul wins
PORTABLE_MAX_ROWS = 1  # the portable twin is plain Numba: from two rows the widening wins
SPLIT_MAX_ROWS = 1  # torch's int4 kernel on both halves: from two rows the blocked bf16 head is faster
TORCH_INT4_OUTPUTS = 16  # torch's int4 packing takes outputs in multiples of this


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux names them (empty where ``/proc/cpuinfo`` cannot be read)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return frozenset()
    return frozenset(word for line in lines if line.startswith("flags") for word in line.split(":", 1)[1].split())


def fine_groups_run_packed() -> bool:
    """Whether :class:`ByteQuantized` weights in groups of 16 run packed on this host (``hetero_kernels`` is
    installed: its packed layout takes them on any CPU); elsewhere they are widened to dense ones at load."""
    return packed_matmul(torch.float32, torch.device("cpu")) is not None


def tile_matmul(dtype: torch.dtype) -> Any:
    """``hetero_kernels.cpu_packed_amx``'s matmul where it runs (AMX) for activations of ``dtype`` (bfloat16),
    else None."""
    if dtype != torch.bfloat16:
        return None
    try:
        from hetero_kernels import cpu_packed_amx
    except ImportError:
        return None
    return cpu_packed_amx.matmul if cpu_packed_amx.SUPPORTED else None


def _kernel_for_few_rows(
    weight: GroupQuantized | ByteQuantized, layout: PackedWeights, vnni: bool, tiles: Any, dtype: torch.dtype
) -> tuple[PackedWeights | Int4Weights | SplitInt4Weights, int]:
    """What multiplies steps of a few rows, and up to how many: the layout on the VNNI kernel (below the AMX
    kernel's rows where ``tiles`` is that kernel); without VNNI, torch's int4 kernel where it takes the
    weights (4-bit, or 8-bit groups of 32 as two halves), else the layout's portable twin, for single rows."""
    if vnni:
        return layout, (TILED_FROM_ROWS - 1 if tiles is not None else PACKED_MAX_ROWS)
    if weight.shape[0] % TORCH_INT4_OUTPUTS == 0:
        if isinstance(weight, GroupQuantized):
            return Int4Weights(weight, dtype), TORCH_INT4_MAX_ROWS
        if weight.group_size == GROUP_SIZE:
            return SplitInt4Weights(weight, dtype), SPLIT_MAX_ROWS
    return layout, PORTABLE_MAX_ROWS


def make_linear(
    weight: Weight,
    bias: torch.Tensor | None,
    weight_format: str,
    dtype: torch.dtype,
    device: torch.device,
    table: bool = False,
    dense_copy: bool = False,
) -> Linear:
    """A linear layer holding ``weight`` in ``weight_format``: ``dense`` (the model's dtype), ``int8``,
    ``int4`` or ``auto`` (packed for weights that arrive group-quantized, else dense). A ``table``
    also looks up embeddings. Packed weights keep a dense copy for steps of many rows only with
    ``dense_copy`` or where they cannot be widened a tile at a time (without ``hetero_kernels``)."""
    if weight_format == "auto":
        weight_format = "dense" if isinstance(weight, torch.Tensor) else "int4"
    if weight_format == "int4" and weight.shape[1] % GROUP_SIZE == 0:
        quantized = weight if not isinstance(weight, torch.Tensor) else GroupQuantized.from_dense(weight)
        kernels = packed_matmul(dtype, device)
        if kernels is not None:
            layout = PackedWeights(quantized, kernels[0])
            tiles = tile_matmul(dtype)
            packed, max_rows = _kernel_for_few_rows(quantized, layout, kernels[1], tiles, dtype)
            dense = quantized.dequantize().to(dtype) if dense_copy else None
            return PackedLinear(packed, quantized.shape, dtype, bias, max_rows, table, layout, dense, tiles)
        if isinstance(quantized, GroupQuantized) and quantized.shape[0] % TORCH_INT4_OUTPUTS == 0:
            dense = quantized.dequantize().to(dtype)
            return PackedLinear(
                Int4Weights(quantized, dtype), quantized.shape, dtype, bias, TORCH_INT4_MAX_ROWS, table, dense=dense
            )
        return DenseLinear(quantized.dequantize().to(device=device, dtype=dtype), bias, table)
    if weight_format in ("int4", "int8"):
        int8 = Int8Weights(as_dense(weight), dtype)
        dense = int8.dequantize().to(dtype) if dense_copy else None
        return PackedLinear(int8, weight.shape, dtype, bias, table=table, rows=Int8Rows(int8), dense=dense)
    return DenseLinear(as_dense(weight).to(device=device, dtype=dtype), bias, table)
