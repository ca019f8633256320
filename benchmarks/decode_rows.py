"""Decode speed of a few sequences at once, with and without the tiled int4 kernel, alternating in one process.

    python benchmarks/decode_rows.py [--sequences 3,4,8,12,16,24,32] [--new-tokens 48] [--rounds 3]

Two engines with the default configuration (bf16, the GGUF's weights packed)
load side by side: one as it is, one with ``hetero_kernels.cpu_int4_tiles``
unavailable, so that its steps of 3 to 8 rows run torch's int4 kernel and
larger ones the dense bf16 copy, as before that kernel. For each count of
sequences, prompts of about 15 tokens decode ``--new-tokens`` tokens
each (EOS ignored), all submitted at once; each engine's best round of
``--rounds`` (the machine is shared) is reported in generated tokens per
second. This is what ``TILED_MAX_ROWS`` in ``hetero_executor_torch.quantized``
was chosen from. Where the CPU lacks AVX-512 BF16, both engines are the same.
"""

from __future__ import annotations

import argparse
import time

import torch

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.model_source import resolve_model_path
from hetero_core.params import GenerationParams
from hetero_executor_torch import quantized


def engine(with_tiles: bool) -> InferenceEngine:
    config = EngineConfig(model=str(resolve_model_path(None)), executor={"name": "torch"}, max_model_len=1024)
    if with_tiles:
        return InferenceEngine(config)
    available = quantized.tiles_kernel
    quantized.tiles_kernel = lambda *args: None
    try:
        return InferenceEngine(config)
    finally:
        quantized.tiles_kernel = available


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", default="3,4,8,12,16,24,32")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engines = {"tiled": engine(True), "without": engine(False)}
    params = GenerationParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    print(f"{args.threads} threads; generated tokens/s, best of {args.rounds} rounds (tiled kernel / without it)")
    for count in (int(n) for n in args.sequences.split(",")):
        prompts = [f"Tell me a long story about the number {i} and its friends." for i in range(count)]
        best = dict.fromkeys(engines, 0.0)
        for _ in range(args.rounds):
            for name, running in engines.items():
                started = time.perf_counter()
                records = running.generate(prompts, params)
                best[name] = max(best[name], sum(len(r.generated_tokens) for r in records) / (time.perf_counter() - started))
        print(f"  {count:3d} sequences: {best['tiled']:7.1f} / {best['without']:7.1f}  ({best['tiled'] / best['without']:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
