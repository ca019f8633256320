"""Offline throughput of the engine against its peers, workload by workload, each run in its own process.

    python benchmarks/throughput.py [--compare-hf] [--workloads standard,sequential,mixed]
        [--peers hetero,hetero-dense,...] [--dtype auto] [--weights auto] [--repeats 1]
        [--attention auto|torch|numba|numba-cuda] [--decode-graphs auto|true|false]

Workloads (``workload.py``): ``standard`` (32 prompts of 16..256 tokens, 64
greedy new tokens each, all at once), ``sequential`` (the same, one request
at a time: batch-1 decode and time to first token) and ``mixed`` (256
requests, prompts 16..512, outputs 16..256, all at once). EOS is ignored.

Peers (``--peers``, or ``--compare-hf`` for all of them): ``hetero`` (the
engine as configured by --dtype/--weights/--attention), ``hetero-json``
(the same, every request constrained to the JSON schema ``RECORDS``, whose
shortest valid answer is longer than any output here, so every request still
generates its full count; it also reports the schema's cold and cached
compile times), ``hetero-dense-copy`` (packed weights with the
executor's ``dense_copy``: steps of many rows multiply a dense copy instead
of widening the packed weights), ``hetero-dense`` (bf16 dense weights),
``hetero-fp32``, ``transformers-bf16``,
``transformers-fp32`` (batched ``generate``, left padding, padded batches of
32 in submission order, each until its longest output) and ``llama-cpp``
(llama-cpp-python on the same GGUF when installed; sequential workload only).
Each (workload, peer) runs in a fresh process, so its peak RSS is its own;
peers alternate within a workload, and ``--repeats`` runs the whole round
again, so ratios come from neighbouring runs on a shared machine.

Where torch sees a CUDA device, the engine runs there (its executors' ``auto``
device) and so does transformers; the peak GPU memory is reported beside the
RSS, and the memory bandwidth is the GPU's.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import child_process  # noqa: E402
from workload import WORKLOADS, Request, percentile, workload  # noqa: E402

HETERO_PEERS = {
    "hetero": {},
    "hetero-json": {},
    "hetero-dense-copy": {"dense_copy": True},
    "hetero-dense": {"dtype": "bfloat16", "weights": "dense"},
    "hetero-fp32": {"dtype": "float32", "weights": "dense"},
}
PEERS = (*HETERO_PEERS, "transformers-bf16", "transformers-fp32", "llama-cpp")
DECODE_GRAPHS = {"auto": "auto", "true": True, "false": False}
CONSTRAINED = {"hetero-json"}
RECORDS = {  # an array of at least 50 small records: structure, integers, bounded strings and booleans
    "type": "array",
    "minItems": 50,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string", "maxLength": 12},
            "ok": {"type": "boolean"},
        },
        "required": ["id", "name", "ok"],
        "additionalProperties": False,
    },
}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------- the engine


def memory_bandwidth_gbs(device) -> float:
    """Read bandwidth of a sum over 256 MiB on ``device`` (what streaming weights at batch 1 is bound by)."""
    import torch

    data = torch.ones(64 * 2**20, device=device)
    data.sum()
    synchronize(device)
    started = time.monotonic()
    for _ in range(5):
        data.sum()
    synchronize(device)
    return 5 * data.numel() * 4 / (time.monotonic() - started) / 1e9


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def weight_bytes(model) -> int:
    """Bytes a batch-1 decode step reads: every linear layer's (packed ones: the packed tensors) and the head's."""
    import numpy as np
    import torch

    def array_bytes(holder) -> int:  # the tensors and arrays a packed weight holder keeps
        return sum(v.nbytes for v in vars(holder).values() if isinstance(v, (torch.Tensor, np.ndarray)))

    def dense_bytes(linear) -> int:  # one copy: oneDNN's blocked layout where there is one (a tied head keeps both)
        return (linear.blocked if linear.blocked is not None else linear.weight).nbytes

    def packed(linear):  # what a batch-1 step multiplies: the VNNI kernel's arrays where there are some
        return linear.vnni if getattr(linear, "vnni", None) is not None else linear.packed

    linears = [linear for layer in model.layers for linear in layer.linears] + [model.lm_head]
    return sum(array_bytes(packed(linear)) if hasattr(linear, "packed") else dense_bytes(linear) for linear in linears)


def compile_times_ms(engine) -> dict:
    """The grammar engine's compile time for a schema it has not seen, and for the same schema again."""
    from hetero_core.structured_output import StructuredOutput

    times = {}
    for key in ("compile_cold_ms", "compile_cached_ms"):
        started = time.monotonic()
        engine.grammars.compile(StructuredOutput.json_schema({**RECORDS, "maxItems": 1000}))
        times[key] = (time.monotonic() - started) * 1e3
    return times


def run_hetero(
    options: dict, requests: list[Request], sequential: bool, args: argparse.Namespace, *, constrained: bool = False
) -> dict:
    from hetero_core import EngineConfig, GenerationParams, hookimpl
    from hetero_core.engine import InferenceEngine
    from hetero_core.plugins import create_plugin_manager
    from hetero_core.structured_output import StructuredOutput

    class StepRecorder:
        def __init__(self) -> None:
            self.steps: list = []

        @hookimpl
        def on_step_finished(self, engine, stats) -> None:
            self.steps.append(stats)

    recorder = StepRecorder()
    pm = create_plugin_manager()
    pm.register(recorder, name="step-recorder")
    executor = {
        "name": "torch",
        "dtype": args.dtype,
        "weights": args.weights,
        "attention": args.attention,
        "num_threads": args.threads,
        "decode_graphs": DECODE_GRAPHS[args.decode_graphs],
        **options,
    }
    config = EngineConfig(
        model=args.model,
        executor=executor,
        max_num_seqs=args.max_num_seqs,
        max_batch_size=args.max_num_seqs,
        max_total_tokens=args.max_total_tokens,
        max_model_len=1024,
    )
    load_started = time.monotonic()
    engine = InferenceEngine(config, plugin_manager=pm)
    load_seconds = time.monotonic() - load_started
    model = engine.executor.model
    execute = engine.executor.execute
    execute_seconds = [0.0]

    def timed_execute(batch):
        started = time.monotonic()
        try:
            return execute(batch)
        finally:
            execute_seconds[0] += time.monotonic() - started

    engine.executor.execute = timed_execute
    constraint = StructuredOutput.json_schema(RECORDS) if constrained else None
    warm = GenerationParams(temperature=0.0, max_tokens=2, ignore_eos=True, structured_output=constraint)
    engine.generate([r.prompt for r in requests[: args.max_num_seqs]], warm)  # a first pass at full size
    engine.allocator.reset_prefix_cache()
    recorder.steps.clear()
    execute_seconds[0] = 0.0

    def params(request: Request) -> GenerationParams:
        return GenerationParams(
            temperature=0.0, max_tokens=request.new_tokens, ignore_eos=True, structured_output=constraint
        )

    started = time.monotonic()
    if sequential:
        records = [engine.generate([r.prompt], params(r))[0] for r in requests]
    else:
        ids = [engine.submit_request(r.prompt, params(r)) for r in requests]
        done = {}
        while len(done) < len(ids):
            done.update((record.request_id, record) for record in engine.step())
        records = [done[i] for i in ids]
    elapsed = time.monotonic() - started
    assert [len(r.generated_tokens) for r in records] == [r.new_tokens for r in requests]
    decode = [s for s in recorder.steps if not s.num_prefill_tokens and s.num_decode_tokens]
    step_seconds = sum(s.duration for s in recorder.steps)
    return {
        **(compile_times_ms(engine) if constrained else {}),
        "elapsed": elapsed,
        "output_tokens": sum(r.new_tokens for r in requests),
        "ttfts": [r.time_to_first_token for r in records],
        "decode_tokens": sum(s.num_decode_tokens for s in decode),
        "decode_seconds": sum(s.duration for s in decode),
        "engine_ms_per_step": (step_seconds - execute_seconds[0]) / max(1, len(recorder.steps)) * 1e3,
        "steps": len(recorder.steps),
        "load_seconds": load_seconds,
        "weights_mb": weight_bytes(model) / 2**20,
        "bandwidth_gbs": memory_bandwidth_gbs(engine.executor.device),
        "config": (
            f"{engine.executor.dtype}, weights {engine.executor.weight_format},"
            f" attention {engine.executor.attention.name}, "
            f"decode graphs {engine.executor.graphs.num_graphs if engine.executor.graphs else 'off'}"
        ),
    }


# ---------------------------------------------------------------------------------------- one run per process


def run_child(peer: str, name: str, args: argparse.Namespace) -> dict:
    import torch

    from hetero_core.model_source import resolve_model_path

    torch.set_num_threads(args.threads)
    requests = workload(name, args.num_requests)
    sequential = name == "sequential"
    if peer in HETERO_PEERS:
        result = run_hetero(HETERO_PEERS[peer], requests, sequential, args, constrained=peer in CONSTRAINED)
    else:
        import peers

        path = resolve_model_path(args.model)
        if peer == "llama-cpp":
            result = peers.run_llama_cpp(path, requests, args.threads)
        else:
            dtype = torch.bfloat16 if peer == "transformers-bf16" else torch.float32
            result = peers.run_transformers(path, dtype, requests, sequential)
    result["peak_rss_mb"] = peak_rss_mb()
    if torch.cuda.is_available():
        result["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if sequential:
        longest = max(range(len(requests)), key=lambda i: len(requests[i].prompt))
        result["ttft_longest"] = result["ttfts"][longest]
    return result


def spawn(peer: str, name: str, argv: list[str]) -> dict | None:
    return child_process.spawn(__file__, f"{peer}:{name}", f"{peer} on {name}", argv)


def describe(peer: str, r: dict) -> str:
    ttfts = r["ttfts"]
    line = (
        f"  {peer:18s} {r['output_tokens'] / r['elapsed']:8.1f} tok/s end-to-end,"
        f" decode {r['decode_tokens'] / max(1e-9, r['decode_seconds']):7.1f} tok/s, "
        f"TTFT mean {sum(ttfts) / len(ttfts) * 1e3:6.0f} ms p50 {percentile(ttfts, 50) * 1e3:6.0f} ms"
    )
    if "ttft_longest" in r:
        line += f", 256-token prompt {r['ttft_longest'] * 1e3:4.0f} ms"
    line += f", peak RSS {r['peak_rss_mb']:5.0f} MiB"
    if "gpu_peak_mb" in r:
        line += f", GPU peak {r['gpu_peak_mb']:5.0f} MiB"
    if "compile_cold_ms" in r:
        line += f", schema compile {r['compile_cold_ms']:.1f} ms cold / {r['compile_cached_ms']:.3f} ms cached"
    if "engine_ms_per_step" in r:
        line += (
            f"\n  {'':18s} [{r['config']}; engine loop {r['engine_ms_per_step']:.2f} ms/step"
            f" over {r['steps']} steps; load {r['load_seconds']:.1f} s; "
            f"a batch-1 decode reads {r['weights_mb']:.0f} MiB of weights,"
            f" memory reads at {r['bandwidth_gbs']:.1f} GB/s]"
        )
    return line


def ratios(results: dict[str, list[dict]]) -> None:
    def best(peer: str, key) -> float | None:
        values = [key(r) for r in results.get(peer, [])]
        return max(values) if values else None

    end_to_end = lambda r: r["output_tokens"] / r["elapsed"]  # noqa: E731
    decode = lambda r: r["decode_tokens"] / max(1e-9, r["decode_seconds"])  # noqa: E731
    ttft = lambda r: -r.get("ttft_longest", float("nan"))  # noqa: E731
    for peer in results:
        if peer not in HETERO_PEERS:
            continue
        unconstrained = ("hetero",) if peer in CONSTRAINED else ()
        for other in (*unconstrained, "transformers-bf16", "transformers-fp32", "llama-cpp"):
            if other not in results:
                continue
            parts = [
                f"end-to-end {best(peer, end_to_end) / best(other, end_to_end):.2f}x",
                f"decode {best(peer, decode) / best(other, decode):.2f}x",
            ]
            if results[peer] and "ttft_longest" in results[peer][0]:
                parts.append(f"TTFT(256) {best(peer, ttft) / best(other, ttft):.2f}x")
            print(f"  ratio {peer} / {other}: {', '.join(parts)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model path (default: the embedded SmolLM2)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weights", default="auto", help="the torch executor's weights option for peer 'hetero'")
    parser.add_argument(
        "--attention",
        default="auto",
        choices=["auto", "torch", "numba", "numba-cuda"],
        help="the torch executor's attention backend",
    )
    parser.add_argument(
        "--decode-graphs",
        default="auto",
        choices=list(DECODE_GRAPHS),
        help="the torch executor's decode graphs (auto: on CUDA)",
    )
    parser.add_argument(
        "--workloads", default="standard,sequential", help=f"comma-separated, from {', '.join(WORKLOADS)}"
    )
    parser.add_argument("--peers", default="hetero", help=f"comma-separated, from {', '.join(PEERS)}")
    parser.add_argument(
        "--compare-hf", action="store_true", help="add transformers bf16 and fp32, and llama-cpp when installed"
    )
    parser.add_argument("--num-requests", type=int, help="requests in the workload (default: 32, mixed 256)")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-total-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        peer, name = args.child.split(":")
        child_process.report(run_child(peer, name, args))
        return
    from peers import llama_cpp_available

    peers = args.peers.split(",")
    if args.compare_hf:
        peers += ["transformers-bf16", "transformers-fp32"] + (["llama-cpp"] if llama_cpp_available() else [])
    unknown = [p for p in peers if p not in PEERS] + [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown peer or workload: {', '.join(unknown)}")
    argv = [a for a in sys.argv[1:] if a != "--compare-hf"]
    print(
        f"{args.threads} threads; hetero: dtype {args.dtype}, weights {args.weights}, attention {args.attention}, "
        f"decode graphs {args.decode_graphs}, max_num_seqs {args.max_num_seqs}"
    )
    for name in args.workloads.split(","):
        print(f"workload {name}")
        results: dict[str, list[dict]] = {}
        for _ in range(args.repeats):
            for peer in peers:
                if peer == "llama-cpp" and name != "sequential":
                    continue
                result = spawn(peer, name, argv)
                if result is not None:
                    results.setdefault(peer, []).append(result)
                    print(describe(peer, result), flush=True)
        ratios(results)


if __name__ == "__main__":
    main()
