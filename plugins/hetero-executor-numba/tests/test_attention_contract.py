"""The attention-backend contract kit passes on ``numba-cuda`` (on the CUDA simulator when there is no GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).with_name("simulated_contract.py")


def test_the_contract_kit_passes() -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"} if not torch.cuda.is_available() else dict(os.environ)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", str(SCRIPT)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout.strip().splitlines()[-1]
