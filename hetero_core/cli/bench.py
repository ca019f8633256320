"""``hetero-infer bench NAME [options]``: run one of the benchmark programs of the source checkout."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from hetero_core.errors import ConfigError

BENCHMARKS = {
    "serve": "serve.py",  # a live server: request throughput, TTFT, TPOT, ITL
    "throughput": "throughput.py",  # the offline engine, optionally against transformers
    "attention": "attention.py",  # the paged-attention kernels
}


def benchmarks_folder() -> Path:
    """``benchmarks/`` beside the package, as in a source checkout (an editable install)."""
    return Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(argv: list[str]) -> int:
    """Run ``benchmarks/<argv[0]>.py`` as a program with the remaining arguments."""
    names = ", ".join(BENCHMARKS)
    if not argv or argv[0] not in BENCHMARKS:
        given = repr(argv[0]) if argv else "nothing"
        raise ConfigError(f"bench needs a benchmark name ({names}), got {given}", param="bench")
    script = benchmarks_folder() / BENCHMARKS[argv[0]]
    if not script.is_file():
        raise ConfigError(
            f"benchmark program {script} not found: the benchmarks ship with the source checkout", param="bench"
        )
    saved_argv = sys.argv
    sys.argv = [str(script), *argv[1:]]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved_argv
    return 0
