"""What the kernels built from LLVM IR share: whether the host CPU has an instruction set, and LLVM's names for its
intrinsics.

Numba compiles for the host CPU unless told otherwise (``NUMBA_CPU_NAME``,
``NUMBA_CPU_FEATURES``); a kernel that calls an x86 intrinsic directly
runs only where both hold.
"""

from __future__ import annotations

import os

from llvmlite import binding, ir
from numba import config

PORTABLE_ENV = "HETERO_KERNELS_PORTABLE"
"""Set (to anything but empty or ``0``), every kernel that needs a CPU feature reports itself
unsupported, so callers take the portable paths, as on a CPU without those features."""


def portable_forced() -> bool:
    return os.environ.get(PORTABLE_ENV, "") not in ("", "0")


def has(*features: str) -> bool:
    """Whether Numba compiles for this CPU and it has every one of ``features`` (LLVM's names, such as
    ``"avx512bf16"``), unless :data:`PORTABLE_ENV` forces the portable paths."""
    present = set(binding.get_host_cpu_features().flatten().split(","))
    compiles_for_host = config.CPU_NAME in (None, "host") and config.CPU_FEATURES is None
    return compiles_for_host and not portable_forced() and {f"+{feature}" for feature in features} <= present


def declare(module: ir.Module, name: str, result: ir.Type, arguments: list[ir.Type]) -> ir.Function:
    """The function ``name`` (an LLVM intrinsic) in ``module``, declared on first use."""
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(result, arguments), name)


class BFloat16(ir.Type):
    """LLVM's ``bfloat``, which the AVX-512 BF16 intrinsics take (llvmlite has no such type)."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other) -> bool:
        return isinstance(other, BFloat16)

    def __hash__(self) -> int:
        return hash("bfloat")


def address(builder: ir.IRBuilder, array, index: ir.Value, pointee: ir.Type) -> ir.Value:
    """A ``pointee`` pointer to element ``index`` (an i64) of ``array``'s data (a Numba array struct)."""
    return builder.bitcast(builder.gep(array.data, [index]), pointee.as_pointer())


def constant(element: ir.Type, values: list[int]) -> ir.Constant:
    """A vector constant of ``element``s."""
    return ir.Constant(ir.VectorType(element, len(values)), values)


def splat(builder: ir.IRBuilder, value: ir.Value, vector: ir.VectorType) -> ir.Value:
    """``value`` in every lane of a ``vector``."""
    one = builder.insert_element(ir.Constant(vector, None), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, one, constant(ir.IntType(32), [0] * vector.count))


FLOATS = ir.VectorType(ir.FloatType(), 16)
BFLOAT16_PAIRS = ir.VectorType(BFloat16(), 32)
DOT_BFLOAT16 = "llvm.x86.avx512bf16.dpbf16ps.512"  # FLOATS + the pairwise products of two BFLOAT16_PAIRS


def dot_bfloat16(builder: ir.IRBuilder, total: ir.Value, first: ir.Value, second: ir.Value) -> ir.Value:
    """``vdpbf16ps``: ``total`` (FLOATS) plus, lane by lane, the two products of the bfloat16 pairs in
    ``first`` and ``second`` (BFLOAT16_PAIRS), in float32."""
    return builder.call(
        declare(builder.module, DOT_BFLOAT16, FLOATS, [FLOATS, BFLOAT16_PAIRS, BFLOAT16_PAIRS]), [total, first, second]
    )
