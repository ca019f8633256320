"""The CUDA kernels on Numba's CUDA simulator, in a pytest subprocess.

``NUMBA_ENABLE_CUDASIM`` only takes effect before ``numba.cuda`` is first
imported, so the simulated tests (``cuda_sim/simulated_kernels.py``) run in
their own process rather than alongside the CPU kernel tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SIMULATED = Path(__file__).parent / "cuda_sim" / "simulated_kernels.py"


def test_cuda_kernels_on_the_simulator() -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    command = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", str(SIMULATED)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "7 passed" in result.stdout, result.stdout[-2000:]
