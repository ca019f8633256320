"""What the ``ray`` backend adds to each request: routing plus the hop to a replica actor and back.

    python benchmarks/router_latency.py                 # 300 single-token requests each way, 2 rounds

Single-token requests, one at a time, through the same synchronous client
(:class:`hetero_serve_openai.client.BackendClient`) over the mock executor (no
model time): first on the ``local_engine`` backend, then on ``ray`` with two
replicas on a local cluster started here (loopback only). The difference of
the medians is the router's added latency per request. Also prints the round
trip of a plain actor call, Ray's floor on the same machine at the same time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray  # noqa: E402

from hetero_core import EngineConfig, GenerationParams  # noqa: E402
from hetero_core.logs import configure_logging  # noqa: E402
from hetero_serve_openai.async_engine import AsyncEngine  # noqa: E402
from hetero_serve_openai.client import BackendClient  # noqa: E402
from hetero_serve_ray import RayBackend  # noqa: E402
from hetero_serve_ray.options import RayBackendOptions  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from workload import percentile  # noqa: E402

MOCK = {
    "tokenizer": "simple",
    "executor": {"name": "mock", "vocab_size": 128},
    "block_size": 4,
    "plugins": {"disable": ["torch", "numba-cuda"]},
    "data_parallel_size": 2,
}


def latencies(client: BackendClient, count: int) -> list[float]:
    params = GenerationParams(max_tokens=1, temperature=0, ignore_eos=True)
    seconds = []
    for number in range(count):
        started = time.perf_counter()
        for _delta in client.stream(f"{number} a short prompt", params):
            pass
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    configure_logging(quiet=True)
    config = EngineConfig.from_mapping(MOCK)
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config={"worker_niceness": 0}
    )
    print(f"{args.requests} single-token requests per measurement, load average {os.getloadavg()[0]:.1f}")
    for _ in range(args.rounds):
        with BackendClient(AsyncEngine(config)) as client:
            latencies(client, 20)
            local = percentile(latencies(client, args.requests), 50)
        with BackendClient(RayBackend(config, RayBackendOptions(num_cpus_per_replica=1))) as client:
            latencies(client, 20)
            replicated = percentile(latencies(client, args.requests), 50)
            actor = client.backend.replicas[0].actor
            pings = []
            for _ in range(args.requests):
                started = time.perf_counter()
                ray.get(actor.metrics.remote())
                pings.append(time.perf_counter() - started)
        print(
            f"median: local_engine {local * 1e3:.2f} ms, ray {replicated * 1e3:.2f} ms,"
            f" added {(replicated - local) * 1e3:.2f} ms;"
            f" plain actor call {statistics.median(pings) * 1e3:.2f} ms"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
