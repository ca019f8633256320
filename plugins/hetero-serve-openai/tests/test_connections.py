"""Slow clients and connection floods (on 127.0.0.1 only): bounded time, bounded connections,
/healthz keeps answering."""

from __future__ import annotations

import asyncio
import errno
import json
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import structlog

from hetero_serve_openai import connections

from .conftest import RunningServer, mock_server_config

MAX_CONNECTIONS = 16


@pytest.fixture(scope="module")
def server():
    config = mock_server_config(server={"read_timeout": 0.5, "max_connections": MAX_CONNECTIONS})
    with RunningServer(config) as running:
        yield running


def connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=10)


def closed_within(connection: socket.socket, seconds: float, trickle: bytes = b"") -> bool:
    """Send ``trickle`` a byte at a time until the server closes the connection; whether it did within ``seconds``."""
    deadline = time.monotonic() + seconds
    connection.settimeout(0.1)
    for byte in trickle.ljust(int(seconds * 10) + 1, b"x"):
        if time.monotonic() > deadline:
            return False
        try:
            if trickle:
                connection.send(bytes([byte]))
            if connection.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset by the server
            return True
    return False


def test_a_connection_that_sends_nothing_is_closed(server) -> None:
    with connect(server) as connection:
        assert closed_within(connection, 5)


def test_a_request_head_that_trickles_in_is_cut(server) -> None:
    with connect(server) as connection:
        assert closed_within(connection, 5, trickle=b"GET /healthz HTTP/1.1\r\nx-slow: ")


def test_a_flood_of_idle_connections_cannot_lock_clients_out(server) -> None:
    flood = [connect(server) for _ in range(10 * MAX_CONNECTIONS)]
    try:
        for _ in range(5):
            assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
        response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=10)
        assert response.status_code == 200
        open_now = [c for c in server.server.server_state.connections if not c.transport.is_closing()]
        assert len(open_now) <= MAX_CONNECTIONS
    finally:
        for connection in flood:
            connection.close()


def test_a_keep_alive_client_keeps_being_served(server) -> None:
    with httpx.Client(base_url=server.url, timeout=5) as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200


def test_resource_exhaustion_is_logged_once_per_interval() -> None:
    handler = connections.log_resource_exhaustion_once()
    loop = asyncio.new_event_loop()
    try:
        with structlog.testing.capture_logs() as logs:
            for _ in range(1000):
                handler(
                    loop,
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(errno.EMFILE, "Too many open files"),
                    },
                )
        assert len(logs) == 1 and logs[0]["log_level"] == "warning" and "Too many open files" in logs[0]["error"]
    finally:
        loop.close()


def test_the_connection_cap_and_backlog_fit_the_file_descriptor_limit(monkeypatch) -> None:
    monkeypatch.setattr(connections.resource, "getrlimit", lambda _which: (512, 512))
    budget = 512 - connections.RESERVED_FILE_DESCRIPTORS
    with structlog.testing.capture_logs() as logs:
        assert connections.fit_to_file_limit(10_000) == (budget // 2, budget - budget // 2)
        assert connections.fit_to_file_limit(100, backlog=200) == (100, 200)
    assert len(logs) == 1 and logs[0]["configured"] == 10_000


def test_a_flood_past_the_file_descriptor_limit_is_survived_quietly(tmp_path) -> None:
    """The served command under a 256-descriptor limit: 600 idle connections, and still /healthz,
    with a handful of log lines."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"tokenizer": "simple", "executor": {"name": "mock", "vocab_size": 128}, "server": {"port": port}})
    )
    limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))  # noqa: E731
    command = [str(Path(sys.executable).parent / "hetero-infer"), "serve", "--config", str(config)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=limit)
    url = f"http://127.0.0.1:{port}"
    flood: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        for _ in range(600):
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        for _ in range(5):
            assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=10).status_code == 200
    finally:
        for connection in flood:
            connection.close()
        process.terminate()
        output = process.communicate(timeout=30)[0]
    lines = output.splitlines()
    assert any("lowered to fit the file-descriptor limit" in line for line in lines), output
    assert len(lines) < 20 and "Traceback" not in output, output
