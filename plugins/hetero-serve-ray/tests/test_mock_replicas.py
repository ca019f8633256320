"""Two mock-executor replicas on a local Ray cluster behind the real HTTP front end.

Which replica served what is read from the replicas' own engine counters,
asked of the actors directly (not the front end's cached copy).
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from typing import Iterator

import httpx
import pytest
import ray
from serve_ray_harness import ReplicatedServer, free_port, mock_config, num_completed, wait_until

from hetero_core.engine import InferenceEngine
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason

SYSTEM = "You are a terse assistant. Answer in one word. " * 2  # 96 characters: 24 blocks of the simple tokenizer
IMBALANCE_TOKENS = 300  # the router's: past this many outstanding tokens over another replica, affinity gives way


@pytest.fixture(scope="module")
def server(ray_cluster: str) -> Iterator[ReplicatedServer]:
    options = {
        "num_cpus_per_replica": 0.5,
        "health_check_interval": 0.2,
        "routing_options": {"imbalance_tokens": IMBALANCE_TOKENS},
    }
    with ReplicatedServer(mock_config(server={"model_name": "mock", "backend_options": options})) as running:
        yield running


def counters(server: ReplicatedServer) -> list:
    return ray.get([r.actor.metrics.remote() for r in server.backend.replicas])


def submitted(server: ReplicatedServer) -> list[int]:
    return [m.requests_submitted for m in counters(server)]


def complete(server: ReplicatedServer, prompt: str, max_tokens: int = 4, **extra) -> httpx.Response:
    body = {"model": "mock", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)


def expected_text(prompt: str, max_tokens: int) -> str:
    """What one mock engine answers (it is deterministic in the prompt)."""
    engine = InferenceEngine(mock_config(data_parallel_size=1))
    return engine.generate([prompt], GenerationParams(max_tokens=max_tokens, temperature=0))[0].output_text


def test_same_prefix_same_replica_and_its_cache_hits(server: ReplicatedServer) -> None:
    before = counters(server)
    for question in ("Why?", "Who is there?", "When?", "How far is it to the moon?"):
        response = complete(server, SYSTEM + question)
        assert response.status_code == 200, response.text
    after = counters(server)
    new = [a.requests_submitted - b.requests_submitted for a, b in zip(after, before, strict=True)]
    assert sorted(new) == [0, 4], new
    chosen = new.index(4)
    assert (
        after[chosen].prefix_cache_hits - before[chosen].prefix_cache_hits >= 3 * 20
    )  # the system prompt's blocks, 3 times


def test_a_busy_replica_gives_way_to_the_least_loaded(server: ReplicatedServer) -> None:
    prompt = SYSTEM + "Count."
    assert complete(server, prompt).status_code == 200  # the prefix now has a home
    before = submitted(server)
    # 900 tokens outstanding on the prefix's replica: over IMBALANCE_TOKENS until about 600 are produced,
    # 6 s at the mock's 10 ms a step, so a busy test machine still routes the next one in time
    long_request = threading.Thread(target=complete, args=(server, prompt, 900))
    long_request.start()
    try:
        # over the threshold, not merely loaded: the first request's prompt tokens leave its replica's load
        # only after its response has reached the client
        wait_until(
            lambda: any(r.load > IMBALANCE_TOKENS for r in server.backend.replicas), "the long request is routed"
        )
        loaded = next(r.index for r in server.backend.replicas if r.load > IMBALANCE_TOKENS)
        assert complete(server, prompt).status_code == 200
        after = submitted(server)
        assert after[loaded] - before[loaded] == 1 and after[1 - loaded] - before[1 - loaded] == 1
    finally:
        long_request.join()  # the next tests count running requests


def test_a_client_that_leaves_aborts_its_request_on_the_replica(server: ReplicatedServer) -> None:
    before = counters(server)
    body = {"model": "mock", "prompt": "a long story", "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as response:
        for number, _line in enumerate(response.iter_lines()):
            if number == 4:
                break  # leave mid-stream

    def aborted() -> bool:
        return sum(m.requests_finished[FinishReason.ABORT] for m in counters(server)) > sum(
            m.requests_finished[FinishReason.ABORT] for m in before
        )

    wait_until(aborted, "the replica aborts the request", timeout=10)
    assert all(m.num_running == 0 for m in counters(server))
    assert sum(m.generation_tokens for m in counters(server)) - sum(m.generation_tokens for m in before) < 200
    assert all(r.load == 0 for r in server.backend.replicas)


def test_metrics_aggregate_the_replicas_with_a_replica_label(server: ReplicatedServer) -> None:
    assert complete(server, "one").status_code == 200 and complete(server, "two", max_tokens=2).status_code == 200
    fresh = counters(server)

    def scraped() -> dict[str, float]:
        text = httpx.get(f"{server.url}/metrics").text
        lines = [line for line in text.splitlines() if line.startswith("vllm:generation_tokens_total{")]
        return {line.split('replica="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in lines}

    wait_until(
        lambda: scraped() == {"0": fresh[0].generation_tokens, "1": fresh[1].generation_tokens},
        "the scrape shows both replicas",
    )
    text = httpx.get(f"{server.url}/metrics").text
    assert 'vllm:request_success_total{finished_reason="length",model_name="mock",replica="0"}' in text
    assert "vllm:time_to_first_token_seconds_count" in text  # the front end's own histograms stay


def test_bad_input_is_refused_before_routing(server: ReplicatedServer) -> None:
    response = complete(server, "x" * 10, max_tokens=10**7)
    assert response.status_code == 400 and "maximum context length" in response.text
    response = complete(server, "fine", max_tokens=1100)
    assert response.status_code == 400 and "KV blocks but the pool has only 256" in response.text, response.text
    response = complete(server, [1, 500])
    assert response.status_code == 400 and "prompt token ids must be integers in [0, 128)" in response.text, (
        response.text
    )


def scrape_counters(server: ReplicatedServer) -> dict[str, float]:
    """Every counter sample of ``/metrics`` by its name and labels."""
    text = httpx.get(f"{server.url}/metrics").text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "_total{" in line}


def num_errors(counters: dict[str, float]) -> float:
    return sum(
        value
        for key, value in counters.items()
        if key.startswith("vllm:request_success_total{") and 'finished_reason="error"' in key
    )


def test_a_stream_whose_replica_dies_ends_with_an_error_event(server: ReplicatedServer) -> None:
    """... and /metrics counts it as an error, and no counter goes backwards when the replica restarts at 0."""
    assert complete(server, "1 warm").status_code == 200 and complete(server, "2 warm").status_code == 200  # one each

    def counted() -> bool:
        return all(
            scrape_counters(server).get(f'vllm:generation_tokens_total{{model_name="mock",replica="{r}"}}')
            for r in "01"
        )

    wait_until(counted, "both replicas' counters are above 0 in /metrics")
    before = scrape_counters(server)
    body = {"model": "mock", "prompt": "a stream to cut", "max_tokens": 900, "temperature": 0, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
            if len(events) == 3:
                (flight,) = server.backend._flights.values()
                ray.kill(flight.replica.actor, no_restart=False)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "failed while generating" in error["message"] and error["type"]
    assert all("choices" in json.loads(event) for event in events[:-2])
    wait_until(lambda: all(r.is_ready for r in server.backend.replicas), "the replica is back")
    assert complete(server, "after the restart").status_code == 200
    wait_until(
        lambda: all(r.is_ready and r.metrics is not None for r in server.backend.replicas), "both replicas report"
    )
    after = scrape_counters(server)
    assert {key: value for key, value in after.items() if key in before and value < before[key]} == {}
    assert num_errors(after) == num_errors(before) + 1  # the front end ended it: no replica counted it


def test_failover_after_a_replica_is_killed(ray_cluster: str) -> None:
    """Requests the dead replica had not started finish on the other one; nothing is lost or doubled; it restarts.

    Each replica runs one request at a time, so when one dies it holds one started request and queued ones.
    """
    options = {"num_cpus_per_replica": 0.5, "health_check_interval": 0.2, "routing": "least_loaded"}
    config = mock_config(max_num_seqs=1, max_batch_size=1, server={"model_name": "mock", "backend_options": options})
    prompts = [f"failover {number}" for number in range(8)]
    expected = {prompt: expected_text(prompt, 40) for prompt in prompts}
    with ReplicatedServer(config) as server:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            futures = {pool.submit(complete, server, prompt, 40): prompt for prompt in prompts}
            flights = server.backend._flights
            wait_until(
                lambda: len(flights) == len(prompts) and all(f.replica for f in list(flights.values())),
                "every request is routed",
            )
            time.sleep(0.1)  # each replica is into its first request (0.4 s long)
            victim, survivor = server.backend.replicas
            ray.kill(victim.actor, no_restart=False)
            wait_until(lambda: not victim.is_ready, "the front end notices", timeout=10)
            assert httpx.get(f"{server.url}/readyz").status_code == 200  # one replica is enough
            results = {futures[f]: f.result() for f in concurrent.futures.as_completed(futures)}
        ok = {p: r.json()["choices"][0]["text"] for p, r in results.items() if r.status_code == 200}
        failed = [r for r in results.values() if r.status_code != 200]
        assert len(failed) <= 1  # only the request the victim had started
        assert all(r.status_code == 503 and "failed while generating" in r.text for r in failed)
        assert ok == {p: expected[p] for p in ok}  # each answer whole and once
        assert len(ok) + len(failed) == len(prompts)
        assert num_completed(ray.get(survivor.actor.metrics.remote())) == len(ok)  # the moved ones ran there
        wait_until(lambda: victim.is_ready, "Ray restarts the replica and it is ready again", timeout=60)
        replies = [
            complete(server, f"after restart {n}") for n in range(2)
        ]  # idle replicas: the first goes to replica 0
        assert all(r.status_code == 200 for r in replies)
        assert num_completed(ray.get(victim.actor.metrics.remote())) >= 1


def test_sigterm_drains_both_replicas(ray_cluster: str, tmp_path) -> None:
    """``hetero-infer serve --data-parallel-size 2`` on the test cluster:
    SIGTERM lets a stream on each replica finish."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    port = free_port()
    config = mock_config(
        server={
            "model_name": "mock",
            "port": port,
            "drain_timeout": 30,
            "backend_options": {"num_cpus_per_replica": 0.25, "health_check_interval": 0.1},
        }
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_json()))
    command = [
        str(Path(sys.executable).parent / "hetero-infer"),
        "serve",
        "--config",
        str(path),
        "--data-parallel-size",
        "2",
        "-o",
        f"server.backend_options.address={ray_cluster}",
    ]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:

        def running_per_replica() -> list[float]:
            try:
                text = httpx.get(f"{url}/metrics").text
            except httpx.HTTPError:
                return []
            return [
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("vllm:num_requests_running{")
            ]

        wait_until(lambda: len(running_per_replica()) == 2, "both replicas of the served process are ready", timeout=90)
        events: list[list[str]] = [[], []]

        def stream(number: int) -> None:
            body = {"prompt": f"{number} drain", "max_tokens": 150, "temperature": 0, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
                events[number].extend(line[6:] for line in response.iter_lines() if line.startswith("data: "))

        streams = [threading.Thread(target=stream, args=(n,)) for n in range(2)]
        for thread in streams:
            thread.start()
        wait_until(lambda: running_per_replica() == [1.0, 1.0], "one stream runs on each replica", timeout=30)
        server.send_signal(signal.SIGTERM)
        for thread in streams:
            thread.join(timeout=60)
        for lines in events:
            assert lines[-1] == "[DONE]"
            assert json.loads(lines[-2])["choices"][0]["finish_reason"] == "length"
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
        print(server.stdout.read().decode()[-3000:])


def test_replicas_that_cannot_load_make_the_server_unready_and_keep_the_reason(ray_cluster: str) -> None:
    options = {"num_cpus_per_replica": 0.25}
    config = mock_config(
        executor={"name": "mock", "no_such_option": 1}, server={"model_name": "mock", "backend_options": options}
    )
    server = ReplicatedServer(config)
    server.thread.start()
    try:
        wait_until(lambda: server.backend.error is not None, "the replicas report their failure", timeout=60)
        assert (
            "has no option 'no_such_option'" in server.backend.error
        )  # logged; clients hear only that it is out of service
        response = httpx.get(f"{server.url}/readyz")
        assert response.status_code == 503 and response.json()["detail"] == "the backend is out of service"
        refused = complete(server, "anything")
        assert refused.status_code == 503 and "out of service" in refused.text and "no_such_option" not in refused.text
    finally:
        server.__exit__()
