"""A ``hetero-infer serve`` process for the serving benchmarks: a free port, and waiting until it is ready."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_ready(process: subprocess.Popen, url: str, *, timeout: float, poll: float = 0.2) -> None:
    """Return once ``url``'s ``/readyz`` answers 200; kill ``process`` and exit after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll)
    process.kill()
    raise SystemExit(f"the server did not become ready within {timeout:.0f} s")
