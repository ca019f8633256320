"""The serving benchmark runs end to end against a live server and reports what it measured."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SERVE_BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "serve.py"


def test_serve_benchmark_reports_throughput_and_latencies(mock_server) -> None:
    command = [
        sys.executable,
        str(SERVE_BENCHMARK),
        "--url",
        mock_server.url,
        "--num-requests",
        "4",
        "--new-tokens",
        "5",
    ]
    command += ["--vocab-size", "128", "--rate", "40"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert re.search(
        r"^requests +4 in [\d.]+ s: [\d.]+ requests/s, 20 output tokens, [\d.]+ output tokens/s$", result.stdout, re.M
    )
    for name in ("TTFT", "TPOT", "ITL"):
        assert re.search(rf"^{name} +mean +[\d.]+ ms +median +[\d.]+ ms +p99 +[\d.]+ ms$", result.stdout, re.M), (
            result.stdout
        )
