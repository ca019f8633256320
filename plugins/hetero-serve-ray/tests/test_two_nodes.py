"""Two simulated nodes on this machine (``ray.cluster_utils.Cluster``), one replica each; offline batches over them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import ray
from ray.cluster_utils import Cluster
from serve_ray_harness import OBJECT_STORE_BYTES, ReplicatedServer, mock_config, num_completed

from hetero_core.engine import InferenceEngine
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason
from hetero_serve_ray import DataParallelEngine

ONE_CPU_EACH = {"num_cpus_per_replica": 1, "health_check_interval": 0.2}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES})
    cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def single_engine(prompts: list, params: GenerationParams) -> list[str]:
    engine = InferenceEngine(mock_config(data_parallel_size=1))
    return [record.output_text for record in engine.generate(prompts, params)]


def test_one_replica_per_node_behind_one_endpoint(cluster: Cluster) -> None:
    with ReplicatedServer(mock_config(server={"model_name": "mock", "backend_options": ONE_CPU_EACH})) as server:
        nodes = {r.node_id for r in server.backend.replicas}
        assert nodes == {n["NodeID"] for n in ray.nodes() if n["Alive"]} and len(nodes) == 2
        for number in range(4):
            body = {"prompt": f"{number} over two nodes", "max_tokens": 5, "temperature": 0}
            assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).status_code == 200
        served = [num_completed(ray.get(r.actor.metrics.remote())) for r in server.backend.replicas]
        assert served == [2, 2]


def test_offline_generate_and_stream_keep_order(cluster: Cluster) -> None:
    prompts = [f"{number} offline prompt" for number in range(10)]
    params = GenerationParams(max_tokens=6, temperature=0)
    with DataParallelEngine(mock_config(), **ONE_CPU_EACH) as engine:
        choices = engine.generate([*prompts, [{"role": "user", "content": "a chat"}]], params)
        assert [c.text for c in choices[:10]] == single_engine(prompts, params)
        assert all(c.finish_reason is FinishReason.LENGTH and len(c.token_ids) == 6 for c in choices)
        deltas = list(engine.stream(prompts[3], params))
        assert "".join(d.text for d in deltas) == choices[3].text and deltas[-1].finish_reason is FinishReason.LENGTH
        served = [ray.get(r.actor.metrics.remote()).requests_submitted for r in engine.backend.replicas]
        assert all(served)


def test_input_file_over_replicas_matches_one_engine(cluster: Cluster, tmp_path: Path) -> None:
    prompts = [f"{number} from a file" for number in range(12)]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    config = mock_config(server={"backend_options": ONE_CPU_EACH})
    (tmp_path / "config.json").write_text(json.dumps(config.to_json()))
    command = [
        str(Path(sys.executable).parent / "hetero-infer"),
        "--input-file",
        str(tmp_path / "prompts.txt"),
        "--config",
        str(tmp_path / "config.json"),
        "--data-parallel-size",
        "2",
        "-o",
        f"server.backend_options.address={cluster.address}",
        "--max-tokens",
        "7",
        "--temperature",
        "0",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["input"] for r in records] == prompts
    assert [r["output"] for r in records] == single_engine(prompts, GenerationParams(max_tokens=7, temperature=0))
    assert "12/12" in done.stderr  # one progress bar over every prompt
