"""Start-up and memory: from a fresh process to the first tokens, and its peak resident memory, per peer.

Each measurement is one new Python process that loads the model, generates a
few greedy tokens from a short prompt and reports:

- ``start``: seconds from the process's own start to the last of those tokens
  (interpreter, imports, loading, warm-up and the tokens themselves);
- ``peak RSS``: the process's high-water resident memory (``VmHWM``);
- ``beyond imports``: that peak less the peak of a process that only imported
  the same libraries (the Python runtime, torch, Numba, tokenizers, jinja2,
  the kernels and the installed plugins), which is what the weights, the KV
  pool, the working buffers and the libraries' first use cost.

The KV pools are sized alike: the engine's holds ``--context`` tokens
(``max_num_blocks`` blocks of 16), llama-cpp-python's ``n_ctx`` is the same.
Runs alternate between peers (this machine is shared); the first run of each
peer is reported apart as the cold start (Numba's cache, the OS file cache).

    python benchmarks/startup.py --model PATH --peers hetero,llama-cpp --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "What is the capital of France?"
BLOCK_SIZE = 16


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(peer: str, model: str | None, context: int, tokens: int, threads: int, started: float) -> dict:
    if peer == "imports":  # every library the engine imports at its start, and its plugins, but no model
        import jinja2  # noqa: F401
        import numba  # noqa: F401
        import tokenizers  # noqa: F401
        import torch  # noqa: F401

        import hetero_executor_torch  # noqa: F401
        import hetero_kernels  # noqa: F401
        import hetero_tokenizer_hf.tokenizer  # noqa: F401
        from hetero_core.plugins import create_plugin_manager

        create_plugin_manager()
    elif peer == "hetero":  # as a user would: torch is imported by the executor plugin, inside the engine's start
        from hetero_core import ComponentSpec, EngineConfig, GenerationParams, InferenceEngine

        config = EngineConfig(
            model=model,
            max_num_blocks=context // BLOCK_SIZE,
            block_size=BLOCK_SIZE,
            executor=ComponentSpec("torch", {"num_threads": threads}),
        )
        engine = InferenceEngine(config)
        [record] = engine.generate([PROMPT], GenerationParams(max_tokens=tokens, temperature=0))
        assert len(record.generated_tokens) >= 1
    elif peer == "llama-cpp":
        from llama_cpp import Llama

        from hetero_core.model_source import resolve_model_path

        llm = Llama(
            model_path=str(resolve_model_path(model)),
            n_ctx=context,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        llm.create_completion(PROMPT, max_tokens=tokens, temperature=0)
    else:
        raise SystemExit(f"unknown peer {peer!r}: choose from imports, hetero, llama-cpp")
    return {"peer": peer, "start": time.time() - started, "peak_rss_mb": peak_rss_mb()}


def measure(peer: str, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        peer,
        "--context",
        str(args.context),
        "--tokens",
        str(args.tokens),
        "--threads",
        str(args.threads),
    ]
    if args.model:
        command += ["--model", args.model]
    started = time.time()
    output = subprocess.run(command + ["--started", repr(started)], check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a .gguf file or a Hugging Face folder (default: the embedded SmolLM2)")
    parser.add_argument("--peers", default="hetero", help="comma-separated, from hetero, llama-cpp")
    parser.add_argument("--context", type=int, default=2048, help="tokens each peer's KV pool holds")
    parser.add_argument("--tokens", type=int, default=4, help="greedy tokens to generate")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="warm runs per peer, after one cold run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.model, args.context, args.tokens, args.threads, args.started)))
        return
    peers = args.peers.split(",")
    size = os.path.getsize(args.model) if args.model and os.path.isfile(args.model) else None
    imports = min(measure("imports", args)["peak_rss_mb"] for _ in range(2))
    runs: dict[str, list[dict]] = {peer: [] for peer in peers}
    for _ in range(args.repeats + 1):
        for peer in peers:
            runs[peer].append(measure(peer, args))
    print(
        f"model: {args.model or 'embedded SmolLM2'}"
        + (f" ({size / 2**20:.0f} MiB)" if size else "")
        + f"; KV pool {args.context} tokens; imports only: {imports:.0f} MiB"
    )
    print(f"{'peer':<10} {'cold start s':>12} {'warm start s':>12} {'peak RSS MiB':>12} {'beyond imports':>14}")
    for peer, results in runs.items():
        cold, warm = results[0], results[1:]
        peak = min(r["peak_rss_mb"] for r in warm)
        beyond = f"{peak - imports:.0f}" if peer == "hetero" else "-"
        print(f"{peer:<10} {cold['start']:>12.2f} {min(r['start'] for r in warm):>12.2f} {peak:>12.0f} {beyond:>14}")


if __name__ == "__main__":
    main()
