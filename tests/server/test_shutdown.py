"""SIGTERM lets in-flight requests finish, then the server exits cleanly."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def test_sigterm_drains_in_flight_streams(tmp_path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "tokenizer": "simple",
                "executor": {"name": "mock", "step_latency": 0.01, "vocab_size": 128},
                "server": {"port": port, "drain_timeout": 20},
            }
        )
    )
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "hetero-infer"), "serve", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
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
        body = {"prompt": "drain me", "max_tokens": 150, "temperature": 0, "stream": True}
        lines = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and not lines:
                    server.send_signal(signal.SIGTERM)  # mid-stream
                lines.append(line)
        events = [line[6:] for line in lines if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
