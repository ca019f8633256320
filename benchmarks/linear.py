"""One linear layer's time per call by rows, at SmolLM2's shapes: packed int4 (torch's kernel, then
``hetero_kernels.cpu_int4`` on float32 arrays as a packed decode step calls it, where this CPU has
AVX-512 VNNI, then ``hetero_kernels.cpu_int4_tiles`` on bf16 activations, where it has AVX-512 BF16),
packed int8, dense bf16 (plain ``F.linear``, then reordered for oneDNN as the engine runs it).

    python benchmarks/linear.py [--rows 1,2,4,8,16,32] [--threads 2] [--copies 1]

Each figure is the lower quartile of 40 timed calls (the machine is shared:
the quartile is steadier than the mean). With ``--copies 30``, each call
takes the next of 30 distinct copies of the weights, so that they come from
memory as in a step of the 30-layer model rather than from cache (the head
always has one copy: it alone is larger than the caches). Together with end-to-end runs, these
figures set ``PACKED_MAX_ROWS`` in ``hetero_executor_torch.quantized`` and show the blocked bf16
layout's gain over ``F.linear`` (``docs/design/2026-11-26-cpu-int4-linear-kernels.md``).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import torch
import torch.nn.functional as F

from hetero_executor_torch.quantized import (
    DenseLinear,
    GroupQuantized,
    Int4Weights,
    Int8Weights,
    TiledInt4Weights,
    VnniInt4Weights,
    tiles_kernel,
    vnni_kernel,
)

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
    kernel = vnni_kernel(torch.bfloat16, torch.device("cpu"), 64)
    tiled_kernel = tiles_kernel(torch.bfloat16, torch.device("cpu"), torch.Size([16, 32]))
    columns = (
        "int4 / "
        + ("int4 VNNI / " if kernel else "")
        + ("int4 tiled / " if tiled_kernel else "")
        + "int8 / bf16 plain / bf16 blocked"
    )
    print(f"{args.threads} threads; microseconds per call ({columns}) by rows")
    with torch.inference_mode():
        for name, (out_features, in_features) in SHAPES.items():
            copies = [
                weights_of(out_features, in_features, kernel, tiled_kernel)
                for _ in range(1 if name == "head" else args.copies)
            ]
            cells = []
            for n in rows:
                x = torch.randn(n, in_features, dtype=torch.bfloat16)
                x32, out32 = x.float().numpy(), np.empty((n, out_features), np.float32)
                paths = [lambda w: w["int4"].matmul(x)]
                if kernel:
                    paths.append(lambda w: kernel.matmul(x32, w["vnni"].packed, w["vnni"].factors, out32))
                if tiled_kernel:
                    paths.append(lambda w: w["tiled"].matmul(x))
                paths += [lambda w: w["int8"].matmul(x), lambda w: F.linear(x, w["dense"]), lambda w: w["blocked"](x)]
                cells.append(f"{n}: " + "/".join(f"{quartile_us(each_copy(call, copies)):.0f}" for call in paths))
            print(f"  {name:8s} {out_features}x{in_features}  " + "  ".join(cells), flush=True)


def weights_of(out_features: int, in_features: int, kernel, tiled_kernel) -> dict:
    """One random weight in every form the paths take (None where this CPU has no kernel for it)."""
    weight = torch.randn(out_features, in_features) * 0.02
    groups = GroupQuantized.from_dense(weight)
    dense = weight.bfloat16()
    return {
        "int4": Int4Weights(groups, torch.bfloat16),
        "vnni": VnniInt4Weights(groups, kernel) if kernel else None,
        "tiled": TiledInt4Weights(groups, tiled_kernel) if tiled_kernel else None,
        "int8": Int8Weights(weight, torch.bfloat16),
        "dense": dense,
        "blocked": DenseLinear(dense, None),
    }


def each_copy(call, copies: list[dict]):
    """A call that goes to the next copy of the weights each time."""
    turn = itertools.cycle(copies)
    return lambda: call(next(turn))


if __name__ == "__main__":
    main()
