"""The CUDA kernels on Numba's CUDA simulator, in a pytest subprocess per file.

``NUMBA_ENABLE_CUDASIM`` only takes effect before ``numba.cuda`` is first
imported, so the simulated tests (``cuda_sim/``, ``cuda_fused_cases.py``) run in their own process
rather than alongside the CPU kernel tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


@pytest.mark.parametrize(("path", "count"), [("cuda_sim/simulated_kernels.py", 8), ("cuda_fused_cases.py", 13)])
def test_cuda_kernels_on_the_simulator(path: str, count: int) -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    command = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", str(TESTS / path)]
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2]
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert f"{count} passed" in result.stdout, result.stdout[-2000:]
