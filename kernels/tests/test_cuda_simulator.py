"""The CUDA kernels, run on Numba's CUDA simulator in a subprocess (the simulator must be
switched on before numba.cuda is first imported, so it cannot share this process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("cuda_sim_check.py")


@pytest.mark.parametrize("seed", [0, 1])
def test_cuda_kernels_match_the_reference_on_the_simulator(seed: int) -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    result = subprocess.run([sys.executable, str(CHECK), str(seed)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "match the reference" in result.stdout
