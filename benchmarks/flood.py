"""A flood of idle connections against `hetero-infer serve` (on 127.0.0.1): can clients still get in, and how much
does it log?

    python benchmarks/flood.py                   # 10,000 connections, server limited to 1,024 file descriptors
    python benchmarks/flood.py --connections 3000 --file-limit 512

Starts the server (simple tokenizer, mock executor) under the given
file-descriptor limit, opens the idle connections (they send nothing), then
sends 20 health checks; reports how many answered, the slowest, and the
server's log lines and tracebacks.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from server_process import free_port, wait_ready  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--file-limit", type=int, default=1024, help="RLIMIT_NOFILE of the server process")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client needs one descriptor per connection
    port = free_port()
    config = Path(tempfile.mkdtemp()) / "config.json"
    config.write_text(
        json.dumps({"tokenizer": "simple", "executor": {"name": "mock", "vocab_size": 128}, "server": {"port": port}})
    )
    limit = args.file_limit
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "hetero-infer"), "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)),
    )
    url = f"http://127.0.0.1:{port}"
    flood: list[socket.socket] = []
    try:
        wait_ready(server, url, timeout=120)
        started = time.monotonic()
        for _ in range(args.connections):
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError as exc:
                print(f"connecting failed after {len(flood)} connections: {exc}")
                break
        print(f"{len(flood)} idle connections opened in {time.monotonic() - started:.1f} s")
        answered, worst = 0, 0.0
        for _ in range(20):
            before = time.monotonic()
            try:
                answered += httpx.get(f"{url}/healthz", timeout=10).status_code == 200
            except httpx.HTTPError:
                pass
            worst = max(worst, time.monotonic() - before)
        print(f"/healthz answered {answered}/20, slowest {worst * 1000:.0f} ms")
    finally:
        for connection in flood:
            connection.close()
        server.terminate()
        output = server.communicate(timeout=60)[0]
    print(f"server log: {len(output.splitlines())} lines, {output.count('Traceback')} tracebacks")


if __name__ == "__main__":
    main()
