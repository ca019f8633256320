"""Decode speed of a few sequences at once, with and without the small-batch kernels, alternating in one process.

    python benchmarks/decode_rows.py [--model PATH] [--sequences 1,3,4,8,12,16,24,32] [--new-tokens 48] [--rounds 3]

Two engines with the default configuration (bf16, the GGUF's weights packed)
load side by side: one as it is, one with the executor option
``small_batch_kernels: false``, which holds 4-bit weights in the VNNI
kernel's layout alone, so that its steps of more than two rows widen them
instead of running the tiled int4 kernel (or torch's). For each count of
sequences, prompts of about 15 tokens decode ``--new-tokens`` tokens each
(EOS ignored), all submitted at once; each engine's best round of
``--rounds`` (the machine is shared) is reported in generated tokens per
second. Where the CPU lacks AVX-512 VNNI, both engines are the same.
"""

from __future__ import annotations

import argparse
import time

import torch

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.model_source import resolve_model_path
from hetero_core.params import GenerationParams


def engine(model: str | None, small_batch_kernels: bool) -> InferenceEngine:
    executor = {"name": "torch", "small_batch_kernels": small_batch_kernels}
    return InferenceEngine(EngineConfig(model=str(resolve_model_path(model)), executor=executor, max_model_len=1024))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model path (default: the embedded SmolLM2)")
    parser.add_argument("--sequences", default="1,3,4,8,12,16,24,32")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engines = {"with": engine(args.model, True), "without": engine(args.model, False)}
    params = GenerationParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    print(
        f"{args.threads} threads; generated tokens/s, best of {args.rounds} rounds (small-batch kernels / without them)"
    )
    for count in (int(n) for n in args.sequences.split(",")):
        prompts = [f"Tell me a long story about the number {i} and its friends." for i in range(count)]
        best = dict.fromkeys(engines, 0.0)
        for _ in range(args.rounds):
            for name, running in engines.items():
                started = time.perf_counter()
                records = running.generate(prompts, params)
                best[name] = max(
                    best[name], sum(len(r.generated_tokens) for r in records) / (time.perf_counter() - started)
                )
        print(
            f"  {count:3d} sequences: {best['with']:7.1f} / {best['without']:7.1f}"
            f"  ({best['with'] / best['without']:.2f}x)",
            flush=True,
        )


if __name__ == "__main__":
    main()
