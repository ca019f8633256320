"""Offline throughput of the engine on the standard workload, optionally against transformers.

    python benchmarks/throughput.py [--compare-hf] [--dtype auto|float32|bfloat16] [--num-requests 32]
        [--executor torch|numba-cuda] [--decode-graphs auto|true|false]

Standard workload: 32 requests of seeded random token ids, prompt lengths
spread evenly over 16..256, exactly 64 greedy new tokens each (EOS ignored),
2 threads. Prints end-to-end, prefill and decode tokens/s, time to first token,
time per output token and peak memory; with --compare-hf it runs transformers'
batched ``generate`` on the same weights and prompts and prints the ratios.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from workload import percentile, standard_prompts  # noqa: E402

from hetero_core import EngineConfig, GenerationParams, hookimpl  # noqa: E402
from hetero_core.engine import InferenceEngine  # noqa: E402
from hetero_core.model_source import resolve_model_path  # noqa: E402
from hetero_core.plugins import create_plugin_manager  # noqa: E402


class StepRecorder:
    """Collects every step's statistics through the observer hook."""

    def __init__(self) -> None:
        self.steps: list = []

    @hookimpl
    def on_step_finished(self, engine, stats) -> None:
        self.steps.append(stats)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_engine(args: argparse.Namespace, recorder: StepRecorder) -> InferenceEngine:
    pm = create_plugin_manager()
    pm.register(recorder, name="step-recorder")
    config = EngineConfig(
        model=args.model,
        executor={
            "name": args.executor,
            "dtype": args.dtype,
            "num_threads": args.threads,
            **({"attention": args.attention} if args.attention else {}),
            **({"decode_graphs": args.decode_graphs == "true"} if args.decode_graphs != "auto" else {}),
        },
        max_num_seqs=args.num_requests,
        max_batch_size=args.num_requests,
        max_total_tokens=args.max_total_tokens,
        max_model_len=1024,
    )
    return InferenceEngine(config, plugin_manager=pm)


def run_engine(engine: InferenceEngine, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    params = GenerationParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    started = time.monotonic()
    records = engine.generate(prompts, params)
    elapsed = time.monotonic() - started
    generated = sum(len(r.generated_tokens) for r in records)
    assert generated == len(prompts) * new_tokens
    ttfts = [r.time_to_first_token for r in records]
    tpots = [(r.duration - r.time_to_first_token) / (len(r.generated_tokens) - 1) for r in records]
    return {
        "elapsed": elapsed,
        "tokens_per_s": generated / elapsed,
        "ttft_mean": sum(ttfts) / len(ttfts),
        "ttft_p50": percentile(ttfts, 50),
        "tpot_mean": sum(tpots) / len(tpots),
        "tpot_p50": percentile(tpots, 50),
    }


def phase_rates(steps: list) -> tuple[float, float]:
    """Prefill tokens/s over steps that computed prompt tokens; decode tokens/s over pure-decode steps."""
    prefill = [s for s in steps if s.num_prefill_tokens]
    decode = [s for s in steps if not s.num_prefill_tokens and s.num_decode_tokens]
    prefill_rate = sum(s.num_prefill_tokens for s in prefill) / max(1e-9, sum(s.duration for s in prefill))
    decode_rate = sum(s.num_decode_tokens for s in decode) / max(1e-9, sum(s.duration for s in decode))
    return prefill_rate, decode_rate


def time_to_first_token(engine: InferenceEngine, prompt: list[int]) -> float:
    record = engine.generate([prompt], GenerationParams(temperature=0.0, max_tokens=1))[0]
    return record.time_to_first_token


def gemm_roofline(engine: InferenceEngine, batch: int) -> float:
    """torch's own matmul FLOP/s at the decode step's shapes (all the model's linear layers, batch rows)."""
    model = engine.executor.model
    weights = [w for layer in model.layers for w in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)] + [model.lm_head]
    x = {w.shape[1]: torch.randn(batch, w.shape[1], dtype=model.dtype, device=model.device) for w in weights}
    flops = sum(2 * batch * w.shape[0] * w.shape[1] for w in weights)
    synchronize = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        for _ in range(2):
            for w in weights:
                torch.nn.functional.linear(x[w.shape[1]], w)
        synchronize()
        started = time.monotonic()
        repeats = 5
        for _ in range(repeats):
            for w in weights:
                torch.nn.functional.linear(x[w.shape[1]], w)
        synchronize()
        elapsed = time.monotonic() - started
    return flops * repeats / elapsed, flops


def run_transformers(args: argparse.Namespace, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    import transformers

    path = resolve_model_path(args.model)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(args.hf_dtype, torch.float32)
    if path.is_file():
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.eval()
    width = max(len(p) for p in prompts)
    pad = 2
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=pad)  # warm-up
        started = time.monotonic()
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=False, pad_token_id=pad,
        )
        elapsed = time.monotonic() - started
        longest = torch.tensor([prompts[-1]])
        started = time.monotonic()
        model.generate(input_ids=longest, attention_mask=torch.ones_like(longest), max_new_tokens=1, do_sample=False, pad_token_id=pad)
        ttft = time.monotonic() - started
    generated = (out.shape[1] - width) * len(prompts)
    return {"elapsed": elapsed, "tokens_per_s": generated / elapsed, "ttft_256": ttft}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model path (default: the embedded SmolLM2)")
    parser.add_argument("--executor", default="torch")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--attention", choices=["torch", "numba"], help="the torch executor's attention backend")
    parser.add_argument("--decode-graphs", default="auto", choices=["auto", "true", "false"], help="replay decode steps from graphs (auto: on CUDA)")
    parser.add_argument("--hf-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--max-total-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare-hf", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    prompts = standard_prompts(args.num_requests)
    recorder = StepRecorder()
    engine = build_engine(args, recorder)
    executor = engine.executor
    attention, graphs = getattr(executor, "attention_backend", "-"), getattr(executor, "uses_graphs", "-")
    device = getattr(executor, "device", "-")
    print(f"model {engine.model_info.name}, executor {args.executor} on {device} (attention {attention}, decode graphs {graphs}), dtype {executor.dtype}, {args.threads} threads")
    run_engine(engine, prompts, 2)  # a first pass at full size, as the transformers run gets below
    engine.allocator.reset_prefix_cache()
    recorder.steps.clear()
    ours = run_engine(engine, prompts, args.new_tokens)
    prefill_rate, decode_rate = phase_rates(recorder.steps)
    engine.allocator.reset_prefix_cache()
    ttft_256 = time_to_first_token(engine, prompts[-1])
    print(f"end-to-end      {ours['tokens_per_s']:8.1f} tokens/s  ({ours['elapsed']:.2f} s for {args.num_requests} x {args.new_tokens} tokens)")
    print(f"prefill         {prefill_rate:8.1f} tokens/s")
    print(f"decode          {decode_rate:8.1f} tokens/s")
    print(f"TTFT            mean {ours['ttft_mean'] * 1e3:.0f} ms, p50 {ours['ttft_p50'] * 1e3:.0f} ms (in the batch); {ttft_256 * 1e3:.0f} ms for a lone 256-token prompt")
    print(f"TPOT            mean {ours['tpot_mean'] * 1e3:.1f} ms, p50 {ours['tpot_p50'] * 1e3:.1f} ms")
    if hasattr(engine.executor, "model"):
        gemm_rate, flops_per_step = gemm_roofline(engine, args.num_requests)
        achieved = decode_rate / args.num_requests * flops_per_step
        print(f"roofline        matmuls at batch {args.num_requests}: {gemm_rate / 1e9:.1f} GFLOP/s; decode achieves {achieved / 1e9:.1f} GFLOP/s ({achieved / gemm_rate:.0%})")
    print(f"peak RSS        {peak_rss_mb():.0f} MiB")
    if args.compare_hf:
        engine.close()
        hf = run_transformers(args, prompts, args.new_tokens)
        print(f"transformers    {hf['tokens_per_s']:8.1f} tokens/s ({args.hf_dtype}, batched generate, left padding); TTFT 256 tokens {hf['ttft_256'] * 1e3:.0f} ms")
        print(f"ratio           throughput {ours['tokens_per_s'] / hf['tokens_per_s']:.2f}x, TTFT {ttft_256 / hf['ttft_256']:.2f}x of transformers'")


if __name__ == "__main__":
    main()
