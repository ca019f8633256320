"""Cache-aware scheduling: ``lpm`` against ``fcfs`` on requests that share long system prompts.

    python benchmarks/prefix_scheduling.py                      # the embedded model, bf16, 2 threads
    python benchmarks/prefix_scheduling.py --policies fcfs,lpm --repeats 2
    python benchmarks/prefix_scheduling.py --executor mock      # the workload's hit rates alone, in seconds

Workload: ``--groups`` system prompts of ``--prefix-tokens`` tokens each
(seeded random ids, control ids avoided), ``--per-group`` requests per
prompt, each with ``--suffix-tokens`` tokens of its own and
``--new-tokens`` greedy new tokens (EOS ignored). The requests arrive
interleaved (A1, B1, C1, ..., A2, B2, ...), all at once, on a KV pool of
``--kv-blocks`` blocks: too small to keep every system prompt cached while
``--max-num-seqs`` requests of different groups run, so the order in which
requests are admitted decides how often a prompt is found in the prefix cache.

Each (policy, repeat) builds a fresh engine, warms it up, empties the
prefix cache and runs the workload. Reported per run: the prefix-cache hit
rate (prompt tokens found cached / prompt tokens looked up, preemptions
included), prompt tokens computed, output and total tokens/s end to end,
mean and worst time to first token, and preemptions.
"""

from __future__ import annotations

import argparse
import random
import time

POLICIES = ("fcfs", "lpm", "priority")


def shared_prompt_workload(
    groups: int, per_group: int, prefix_tokens: int, suffix_tokens: int, token_ids: range, seed: int = 0
) -> list[list[int]]:
    """The prompts in arrival order: request ``i`` belongs to group ``i % groups``."""
    rng = random.Random(seed)
    prefixes = [[rng.choice(token_ids) for _ in range(prefix_tokens)] for _ in range(groups)]
    return [
        prefixes[i % groups] + [rng.choice(token_ids) for _ in range(suffix_tokens)] for i in range(groups * per_group)
    ]


def engine_config(policy: str, args: argparse.Namespace):
    from hetero_core import EngineConfig

    if args.executor == "mock":
        executor: dict = {"name": "mock"}
        tokenizer = "simple"
    else:
        executor = {"name": "torch", "num_threads": args.threads}
        tokenizer = "huggingface"
    scheduler = (
        {"name": policy, "max_overtakes": args.max_overtakes}
        if policy == "lpm" and args.max_overtakes is not None
        else policy
    )
    return EngineConfig(
        scheduler=scheduler,
        executor=executor,
        tokenizer=tokenizer,
        block_size=16,
        max_num_blocks=args.kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_batch_size=args.max_num_seqs,
        max_total_tokens=args.max_total_tokens,
        max_model_len=2048,
    )


def run(policy: str, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    from hetero_core import GenerationParams
    from hetero_core.engine import InferenceEngine

    engine = InferenceEngine(engine_config(policy, args))
    try:
        engine.generate(
            [[100 + i] * 64 for i in range(args.max_num_seqs)],
            GenerationParams(temperature=0, max_tokens=2, ignore_eos=True),
        )
        engine.allocator.reset_prefix_cache()
        metrics = engine.metrics
        queries, hits, preemptions = metrics.prefix_cache_queries, metrics.prefix_cache_hits, metrics.num_preemptions
        params = GenerationParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
        started = time.monotonic()
        records = engine.generate(prompts, params)
        elapsed = time.monotonic() - started
        assert all(len(r.generated_tokens) == args.new_tokens for r in records)
        assert engine.get_memory_stats().used_blocks == 0
        queries, hits = metrics.prefix_cache_queries - queries, metrics.prefix_cache_hits - hits
        ttfts = [r.time_to_first_token for r in records]
        output_tokens = len(prompts) * args.new_tokens
        return {
            "hit_rate": hits / queries if queries else 0.0,
            "prompt_tokens_computed": queries - hits,
            "output_tokens_per_s": output_tokens / elapsed,
            "tokens_per_s": (sum(map(len, prompts)) + output_tokens) / elapsed,
            "elapsed": elapsed,
            "ttft_mean": sum(ttfts) / len(ttfts),
            "ttft_max": max(ttfts),
            "preemptions": metrics.num_preemptions - preemptions,
            "outputs": [r.generated_tokens for r in records],
        }
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="fcfs,lpm", help=f"comma-separated, from {', '.join(POLICIES)}")
    parser.add_argument("--groups", type=int, default=6, help="distinct system prompts")
    parser.add_argument("--per-group", type=int, default=6, help="requests sharing each system prompt")
    parser.add_argument("--prefix-tokens", type=int, default=256, help="tokens of each system prompt")
    parser.add_argument("--suffix-tokens", type=int, default=16, help="tokens of each request's own part")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=80, help="KV pool size, in blocks of 16 tokens")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-total-tokens", type=int, default=2048)
    parser.add_argument("--max-overtakes", type=int, help="the lpm option (default: the policy's)")
    parser.add_argument(
        "--executor", choices=["torch", "mock"], default="torch", help="mock: hit rates only, timings mean nothing"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policies {', '.join(unknown)}; known: {', '.join(POLICIES)}")

    token_ids = (
        range(256) if args.executor == "mock" else range(17, 49152)
    )  # the simple tokenizer's bytes; no control ids
    prompts = shared_prompt_workload(args.groups, args.per_group, args.prefix_tokens, args.suffix_tokens, token_ids)
    print(
        f"{len(prompts)} requests: {args.groups} system prompts of {args.prefix_tokens} tokens"
        f" x {args.per_group} requests,"
        f" +{args.suffix_tokens} own tokens, {args.new_tokens} new tokens each, interleaved;"
        f" KV pool {args.kv_blocks} blocks"
        f" of 16, max_num_seqs {args.max_num_seqs}, executor {args.executor}, {args.threads} threads"
    )
    outputs: dict[str, list] = {}
    for _ in range(args.repeats):
        for policy in policies:
            r = run(policy, prompts, args)
            outputs.setdefault(policy, r.pop("outputs"))
            print(
                f"  {policy:8s} prefix hit rate {r['hit_rate']:6.1%},"
                f" prompt tokens computed {r['prompt_tokens_computed']:6d},"
                f" {r['output_tokens_per_s']:7.1f} output tok/s, {r['tokens_per_s']:8.1f} tok/s with prompts,"
                f" {r['elapsed']:6.1f} s,"
                f" TTFT mean {r['ttft_mean']:5.2f} s max {r['ttft_max']:5.2f} s, {r['preemptions']} preemptions",
                flush=True,
            )
    first = next(iter(outputs.values()))
    same = all(o == first for o in outputs.values())
    # the mock executor's tokens never depend on batching; bf16 ones may (chunking, cached against recomputed KV)
    print(f"  greedy outputs identical across policies: {'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
