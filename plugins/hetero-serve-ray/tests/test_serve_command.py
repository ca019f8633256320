"""``hetero-infer serve --data-parallel-size 2`` as a process, on the cluster it starts itself or on one it joins.

Every process of a server's cluster is in the server's session (it is
started with ``start_new_session``), so what it leaves behind is found by
session id.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from serve_ray_harness import OBJECT_STORE_BYTES, free_port, mock_config, wait_until

HETERO_INFER = str(Path(sys.executable).parent / "hetero-infer")
NUM_LOGGED = 24  # short requests whose "request finished" lines Ray would fold into one "repeated 23x"
DRAIN_TIMEOUT = 4.0  # seconds: a 60-token stream (0.6 s) finishes within it, a 900-token one (9 s) is cut


def write_config(tmp_path: Path, **server) -> tuple[Path, str]:
    port = free_port()
    backend_options = {"num_cpus_per_replica": 0.25, "health_check_interval": 0.1}
    config = mock_config(server={"model_name": "mock", "port": port, "backend_options": backend_options, **server})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_json()))
    return path, f"http://127.0.0.1:{port}"


def session_processes(session: int) -> list[str]:
    """``pid name`` of every live process in session ``session``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == session:  # state, ppid, pgrp, session
            found.append(f"{entry.name} {name}")
    return found


def end_session(process: subprocess.Popen) -> None:
    """Kill whatever a failed test left of ``process`` and its cluster."""
    if process.poll() is None:
        process.kill()
        process.wait()
    for line in session_processes(process.pid):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def running_per_replica(url: str) -> list[float]:
    try:
        text = httpx.get(f"{url}/metrics").text
    except httpx.HTTPError:
        return []
    return [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running{")
    ]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """A server with its own private Ray cluster, its log (stdout and stderr) in a file;
    the last test that uses it ends it."""
    tmp_path = tmp_path_factory.mktemp("served")
    config, url = write_config(tmp_path, drain_timeout=DRAIN_TIMEOUT)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [HETERO_INFER, "serve", "--config", str(config), "--data-parallel-size", "2"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: len(running_per_replica(url)) == 2 or process.poll() is not None,
            "both replicas are ready",
            timeout=120,
        )
        assert process.poll() is None, log.read_text()[-3000:]
        yield process, url, log
    finally:
        end_session(process)


def test_every_request_finished_line_reaches_the_log(served) -> None:
    _process, url, log = served
    for number in range(NUM_LOGGED):
        body = {
            "prompt": f"{number} log line",
            "max_tokens": 2,
            "temperature": 0,
        }  # no shared prefix: the replicas take turns
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200

    def logged() -> int:
        return log.read_text().count('"request finished"')

    wait_until(lambda: logged() >= NUM_LOGGED, f"{NUM_LOGGED} request lines are in the log", timeout=20)
    assert "repeated" not in log.read_text()


def test_sigterm_drains_both_replicas_then_exits_0_and_leaves_no_process(served) -> None:
    """One stream finishes within the drain timeout, the other is cut with an error event; Ray's processes all end."""
    process, url, log = served
    events: list[list[str]] = [[], []]

    def stream(number: int, max_tokens: int) -> None:
        body = {"prompt": f"{number} drain", "max_tokens": max_tokens, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            events[number].extend(line[6:] for line in response.iter_lines() if line.startswith("data: "))

    streams = [threading.Thread(target=stream, args=(0, 60)), threading.Thread(target=stream, args=(1, 900))]
    for thread in streams:
        thread.start()
    wait_until(lambda: running_per_replica(url) == [1.0, 1.0], "one stream runs on each replica", timeout=30)
    process.send_signal(signal.SIGTERM)
    for thread in streams:
        thread.join(timeout=60)
    finished, cut = events
    assert finished[-1] == "[DONE]" and json.loads(finished[-2])["choices"][0]["finish_reason"] == "length", finished[
        -3:
    ]
    assert cut[-1] == "[DONE]", cut[-3:]
    assert "shut down before this request finished" in json.loads(cut[-2])["error"]["message"]
    assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
    wait_until(lambda: not session_processes(process.pid), "every process of its cluster has ended", timeout=30)


TOKEN_CLUSTER = f"""
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 1, "object_store_memory": {OBJECT_STORE_BYTES}}})
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


def test_a_cluster_with_token_authentication_is_named_as_the_cause(tmp_path: Path) -> None:
    """Ray says only ConnectionError; the server's error names the authentication and RAY_AUTH_MODE=token."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    head = subprocess.Popen(
        [sys.executable, "-c", TOKEN_CLUSTER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        address = head.stdout.readline().strip()
        assert address, "the token-authenticated cluster did not start"
        config, _url = write_config(tmp_path)
        without_token = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
        without_token["RAY_gcs_server_port_wait_time_s"] = "1"  # one try to reach the cluster, not twenty
        done = subprocess.run(
            [
                HETERO_INFER,
                "serve",
                "--config",
                str(config),
                "--data-parallel-size",
                "2",
                "-o",
                f"server.backend_options.address={address}",
            ],
            env=without_token,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode != 0
        assert "uses token authentication and refused this process" in done.stderr, done.stderr[-3000:]
        assert "RAY_AUTH_MODE=token" in done.stderr and "InvalidAuthToken" in done.stderr
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=30)
        finally:
            end_session(head)
