"""SIGTERM lets in-flight requests finish, ends what outlasts the drain timeout with an error, then exits 0;
a backend that cannot start exits non-zero."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration  # the installed plugins, in a real process

HETERO_INFER = str(Path(sys.executable).parent / "hetero-infer")


def start_server(tmp_path: Path, **server: Any) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "tokenizer": "simple",
                "executor": {"name": "mock", "step_latency": 0.01, "vocab_size": 128},
                "server": {"port": port, **server},
            }
        )
    )
    process = subprocess.Popen(
        [HETERO_INFER, "serve", "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.2)


def stream_with_sigterm(process: subprocess.Popen, url: str, max_tokens: int) -> list[str]:
    body = {"prompt": "drain me", "max_tokens": max_tokens, "temperature": 0, "stream": True}
    lines = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and not lines:
                process.send_signal(signal.SIGTERM)  # mid-stream
            lines.append(line)
    return [line[6:] for line in lines if line.startswith("data: ")]


def test_sigterm_drains_in_flight_streams(tmp_path) -> None:
    process, url = start_server(tmp_path, drain_timeout=20)
    try:
        events = stream_with_sigterm(process, url, 150)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_a_stream_cut_at_the_drain_timeout_ends_with_an_error_event(tmp_path) -> None:
    process, url = start_server(tmp_path, drain_timeout=0.5)
    try:
        started = time.monotonic()
        events = stream_with_sigterm(process, url, 2000)  # 20 s of tokens: far past the drain timeout
        assert time.monotonic() - started < 10
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_overloaded" and "shut down before this request finished" in error["message"]
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_a_model_that_cannot_load_exits_non_zero_with_the_reason(tmp_path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model": str(tmp_path / "absent.gguf"), "server": {"port": 0}}))
    result = subprocess.run(
        [HETERO_INFER, "serve", "--config", str(config)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "absent.gguf" in result.stderr and "the server stopped" in result.stderr
