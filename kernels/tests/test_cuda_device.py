"""The CUDA kernels on a real GPU, in a pytest subprocess; skipped where there is none."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


@pytest.mark.skipif(
    shutil.which("nvidia-smi") is None or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="no CUDA GPU"
)
@pytest.mark.parametrize("path", ["cuda_device/device_kernels.py", "cuda_fused_cases.py"])
def test_cuda_kernels_on_the_gpu(path: str) -> None:
    command = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", str(TESTS / path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
