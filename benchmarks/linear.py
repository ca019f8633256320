"""One linear layer's time per call by rows, at SmolLM2's shapes, on every path a CPU weight takes: the
packed layout (``hetero_kernels.cpu_packed``) with 4-bit weights on its VNNI kernel (where this CPU has
AVX-512 VNNI) and on its portable twin, torch's int4 kernel, the packed layout with the same weights in
the 8-bit form (VNNI, twin), int8 per channel, dense bf16 (plain ``F.linear``, then reordered for
oneDNN as the engine runs it), and the packed layout widened a tile at a time for a dense matmul (what
a packed layer does above its kernel's rows). Activations are bf16, as in the engine's default dtype.

    python benchmarks/linear.py [--rows 1,2,4,8,16,32] [--threads 2] [--copies 1]

Each figure is the lower quartile of 40 timed calls (the machine is shared:
the quartile is steadier than the mean). With ``--copies 30``, each call
takes the next of 30 distinct copies of the weights, so that they come from
memory as in a step of the 30-layer model rather than from cache (the head
always has one copy: it alone is larger than the caches). Together with end-to-end runs, these
figures set ``PACKED_MAX_ROWS`` and ``TORCH_INT4_MAX_ROWS`` in ``hetero_executor_torch.quantized`` and
show the blocked bf16 layout's gain over ``F.linear`` (``docs/design/2026-11-27-one-packed-layout.md``,
``docs/design/2026-11-26-cpu-int4-linear-kernels.md``).
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
import torch.nn.functional as F

from hetero_executor_torch.quantized import (
    DenseLinear,
    GroupQuantized,
    Int4Weights,
    Int8Weights,
    PackedLinear,
    PackedWeights,
    as_bytes,
)
from hetero_kernels import cpu_packed, cpu_packed_vnni

SHAPES = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}


def quartile_us(call, repeats: int = 40) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return sorted(times)[repeats // 4] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--copies", type=int, default=1, help="distinct copies of each weight, used in turn (30: from memory)"
    )
    args = parser.parse_args()
    if args.copies < 1:
        parser.error(f"--copies must be at least 1, got {args.copies}")
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    vnni = cpu_packed_vnni.SUPPORTED
    paths = {
        **({"4-bit VNNI": lambda w, x: w["vnni4"].matmul(x)} if vnni else {}),
        "4-bit twin": lambda w, x: w["twin4"].matmul(x),
        "torch int4": lambda w, x: w["int4"].matmul(x),
        **({"8-bit VNNI": lambda w, x: w["vnni8"].matmul(x)} if vnni else {}),
        "8-bit twin": lambda w, x: w["twin8"].matmul(x),
        "int8": lambda w, x: w["int8"].matmul(x),
        "bf16 plain": lambda w, x: F.linear(x, w["dense"]),
        "bf16 blocked": lambda w, x: w["blocked"](x),
        "widen + dense": lambda w, x: w["widened"](x),
    }
    print(f"{args.threads} threads; microseconds per call ({' / '.join(paths)}) by rows")
    with torch.inference_mode():
        for name, (out_features, in_features) in SHAPES.items():
            copies = [weights_of(out_features, in_features, vnni) for _ in range(1 if name == "head" else args.copies)]
            cells = []
            for n in rows:
                x = torch.randn(n, in_features, dtype=torch.bfloat16)
                times = (quartile_us(each_copy(path, copies, x)) for path in paths.values())
                cells.append(f"{n}: " + "/".join(f"{t:.0f}" for t in times))
            print(f"  {name:8s} {out_features}x{in_features}  " + "  ".join(cells), flush=True)


def weights_of(out_features: int, in_features: int, vnni: bool) -> dict:
    """One random weight in every form the paths take: 4-bit groups, the same groups in the 8-bit form,
    int8 per channel, dense bf16 (the VNNI forms only where this CPU runs that kernel)."""
    weight = torch.randn(out_features, in_features) * 0.02
    groups = GroupQuantized.from_dense(weight)
    eight = as_bytes(groups)
    dense = weight.bfloat16()
    twin4 = PackedWeights(groups, cpu_packed.matmul)
    widened = PackedLinear(twin4, groups.shape, torch.bfloat16, None, rows=twin4)
    widened.max_rows = 0  # every step widens
    return {
        "vnni4": PackedWeights(groups, cpu_packed_vnni.matmul) if vnni else None,
        "twin4": twin4,
        "int4": Int4Weights(groups, torch.bfloat16),
        "vnni8": PackedWeights(eight, cpu_packed_vnni.matmul) if vnni else None,
        "twin8": PackedWeights(eight, cpu_packed.matmul),
        "int8": Int8Weights(weight, torch.bfloat16),
        "dense": dense,
        "blocked": DenseLinear(dense, None),
        "widened": widened,
    }


def each_copy(path, copies: list[dict], x: torch.Tensor):
    """A call of ``path`` on ``x`` that goes to the next copy of the weights each time."""
    turn = itertools.cycle(copies)
    return lambda: path(next(turn), x)


if __name__ == "__main__":
    main()
