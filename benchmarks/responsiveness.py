"""Does one heavy request stall everyone else? The worst ``/healthz`` latency while it runs.

    python benchmarks/responsiveness.py  # starts `hetero-infer serve` itself (real tokenizer, mock executor)
    python benchmarks/responsiveness.py --url http://127.0.0.1:8000

Each case sends one heavy request and, until it is answered, polls
``/healthz`` every 10 ms from the same client; it reports the heavy
request's status and time, and the slowest health check. The server runs in
its own process, so the client's own work does not count.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from server_process import free_port, wait_ready  # noqa: E402

WORDS = "the quick brown fox jumps over the lazy dog "
BIG_TEXT = WORDS * (3_600_000 // len(WORDS))  # 3.6 MB
CASES = [
    ("3.6 MB prompt", "/v1/completions", {"prompt": BIG_TEXT, "max_tokens": 1}),
    (
        "3.6 MB chat message",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": BIG_TEXT}], "max_tokens": 1},
    ),
    ("1000 prompts x n=64", "/v1/completions", {"prompt": [f"p{i}" for i in range(1000)], "n": 64, "max_tokens": 4}),
    (
        "16 prompts x n=16, 64 tokens",
        "/v1/completions",
        {"prompt": [f"p{i}" for i in range(16)], "n": 16, "max_tokens": 64, "ignore_eos": True},
    ),
]


def start_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = {
        "tokenizer": "huggingface",
        "executor": {"name": "mock", "vocab_size": 49152},
        "max_model_len": 8192,
        "server": {"port": port, "max_body_bytes": 8 * 1024 * 1024},
    }
    path = Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(json.dumps(config))
    command = [str(Path(sys.executable).parent / "hetero-infer"), "serve", "--config", str(path)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(process, url, timeout=300)
    return process, url


def measure(url: str, label: str, path: str, body: dict) -> None:
    content = json.dumps(body).encode()
    answered: dict[str, httpx.Response] = {}

    def send() -> None:
        answered["response"] = httpx.post(
            f"{url}{path}", content=content, headers={"content-type": "application/json"}, timeout=900
        )

    heavy = threading.Thread(target=send)
    started = time.monotonic()
    heavy.start()
    worst = 0.0
    while heavy.is_alive():
        before = time.monotonic()
        httpx.get(f"{url}/healthz", timeout=900)
        worst = max(worst, time.monotonic() - before)
        time.sleep(0.01)
    elapsed = time.monotonic() - started
    print(
        f"{label:30} status {answered['response'].status_code} in {elapsed:6.2f} s"
        f"   worst /healthz {worst * 1000:6.0f} ms",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    args = parser.parse_args()
    process, url = (None, args.url) if args.url else start_server()
    try:
        for case in CASES:
            measure(url, *case)
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    main()
