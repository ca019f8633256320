"""Serving benchmark in the style of vLLM's ``bench serve``: streamed requests against a live server.

    python benchmarks/serve.py                       # starts `hetero-infer serve` itself, all requests at once
    python benchmarks/serve.py --rate 4              # Poisson arrivals, 4 requests/s
    python benchmarks/serve.py --url http://127.0.0.1:8000 --model NAME
    python benchmarks/serve.py --compare-offline     # also the offline engine on the same workload
    python benchmarks/serve.py --data-parallel-size 2 --threads 2   # two replicas on Ray, one thread each

The workload is the standard one (seeded random token-id prompts of 16..256
tokens, 64 new tokens each, EOS ignored). Reports request throughput, output
tokens/s, and mean / median / p99 of time to first token (TTFT), time per
output token (TPOT) and inter-token latency (ITL); then the median latency of
single-token requests sent one at a time (``--probes``), whose difference
between a replicated and a single-engine server is what routing and the
actor hop add to each request.

With ``--data-parallel-size N`` the server runs N replicas on a local Ray
cluster (``hetero-serve-ray``), each with ``--threads / N`` threads.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from server_process import free_port, wait_ready  # noqa: E402
from workload import percentile, standard_prompts  # noqa: E402


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], new_tokens: int) -> dict:
    """One streamed completion; token counts come from the server's usage chunk, times from the chunks' arrival."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": new_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    token_times: list[float] = []
    output_tokens = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    token_times.append(time.perf_counter())
                if chunk.get("usage"):
                    output_tokens = chunk["usage"]["completion_tokens"]
    finished = time.perf_counter()
    if not token_times:
        raise RuntimeError(f"a request of {len(prompt)} prompt tokens streamed no text")
    return {
        "ttft": token_times[0] - started,
        "tpot": (finished - token_times[0]) / max(1, output_tokens - 1),
        "itl": [b - a for a, b in itertools.pairwise(token_times)],
        "latency": finished - started,
        "output_tokens": output_tokens,
    }


async def run_load(
    url: str, model: str, prompts: list[list[int]], new_tokens: int, rate: float | None, seed: int
) -> tuple[list[dict], float]:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=len(prompts))) as client:
        started = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(one_request(client, url, model, prompt, new_tokens)))
            if rate:
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - started


def probe_latencies(url: str, model: str, prompt: list[int], count: int) -> list[float]:
    """Seconds per single-token, non-streamed request, sent one after another on one connection."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": True}
    latencies = []
    with httpx.Client(timeout=60) as client:
        for _ in range(count):
            started = time.perf_counter()
            client.post(f"{url}/v1/completions", json=body).raise_for_status()
            latencies.append(time.perf_counter() - started)
    return latencies


def report(results: list[dict], elapsed: float) -> float:
    output_tokens = sum(r["output_tokens"] for r in results)
    throughput = output_tokens / elapsed
    print(
        f"requests        {len(results)} in {elapsed:.2f} s: {len(results) / elapsed:.2f} requests/s, "
        f"{output_tokens} output tokens, {throughput:.1f} output tokens/s"
    )
    for name, values in (
        ("TTFT", [r["ttft"] for r in results]),
        ("TPOT", [r["tpot"] for r in results]),
        ("ITL", [x for r in results for x in r["itl"]]),
    ):
        print(
            f"{name:15s} mean {statistics.mean(values) * 1e3:8.1f} ms"
            f"   median {percentile(values, 50) * 1e3:8.1f} ms"
            f"   p99 {percentile(values, 99) * 1e3:8.1f} ms"
        )
    return throughput


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "hetero-infer"),
        "serve",
        "--port",
        str(port),
        "-o",
        f"executor.dtype={args.dtype}",
    ]
    command += [
        "--max-num-seqs",
        str(args.num_requests),
        "--max-batch-size",
        str(args.num_requests),
        "--max-model-len",
        "1024",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if args.data_parallel_size > 1:
        threads = max(1, args.threads // args.data_parallel_size)
        options = {"num_cpus_per_replica": threads, "num_threads_per_replica": threads}
        config = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump({"server": {"backend_options": options}}, config)
        config.close()
        command += ["--config", config.name, "--data-parallel-size", str(args.data_parallel_size)]
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # the local Ray cluster stays on 127.0.0.1
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_ready(server, url, timeout=180, poll=0.5)
    return server, url


def offline_throughput(args: argparse.Namespace, prompts: list[list[int]]) -> float:
    import torch

    from hetero_core import EngineConfig, GenerationParams
    from hetero_core.engine import InferenceEngine

    torch.set_num_threads(args.threads)
    config = EngineConfig(
        executor={"name": "torch", "dtype": args.dtype},
        max_num_seqs=args.num_requests,
        max_batch_size=args.num_requests,
        max_model_len=1024,
    )
    engine = InferenceEngine(config)
    engine.generate(prompts[:2], GenerationParams(temperature=0.0, max_tokens=4))
    started = time.perf_counter()
    engine.generate(prompts, GenerationParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True))
    return args.new_tokens * len(prompts) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--model", help="the model name the server serves (default: asked from /v1/models)")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, help="Poisson arrival rate in requests/s (default: all at once)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--vocab-size", type=int, default=49152, help="prompt token ids are drawn below this (default: SmolLM2's)"
    )
    parser.add_argument("--compare-offline", action="store_true")
    parser.add_argument(
        "--data-parallel-size", type=int, default=1, help="engine replicas on Ray when the benchmark starts the server"
    )
    parser.add_argument("--probes", type=int, default=20, help="single-token requests, one at a time, after the load")
    args = parser.parse_args()

    prompts = standard_prompts(args.num_requests, vocab_size=args.vocab_size, seed=args.seed)
    server = None
    probes: list[float] = []
    url = args.url
    if url is None:
        server, url = start_server(args)
    try:
        model = args.model or httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        asyncio.run(run_load(url, model, prompts[:2], 4, None, args.seed))  # warm-up
        results, elapsed = asyncio.run(run_load(url, model, prompts, args.new_tokens, args.rate, args.seed))
        probes = probe_latencies(url, model, prompts[0][:16], args.probes)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    served = report(results, elapsed)
    if probes:
        print(
            f"single-token request latency, one at a time: median {percentile(probes, 50) * 1e3:.1f} ms"
            f" over {len(probes)}"
        )
    if args.compare_offline:
        offline = offline_throughput(args, prompts)
        print(f"offline engine  {offline:.1f} output tokens/s; through the server: {served / offline:.0%} of it")


if __name__ == "__main__":
    main()
