"""The attention-backend contract kit on ``numba-cuda``: on a GPU, or on the CUDA simulator with NUMBA_ENABLE_CUDASIM=1
(the kit's small shapes). ``test_attention_contract.py`` runs it in a process of its own: the simulator is chosen
before numba loads."""

from __future__ import annotations

import pytest
import torch

from hetero_executor_numba import NumbaCudaAttention
from hetero_executor_numba.attention import simulator_enabled
from hetero_executor_torch.testing import AttentionBackendContract
from hetero_kernels import cuda as kernels

kernels.configure(tile=8)  # the simulator runs each GPU thread as a Python thread: keep blocks small


class TestNumbaCudaAttention(AttentionBackendContract):
    @pytest.fixture
    def backend(self):
        return NumbaCudaAttention()

    @pytest.fixture
    def device(self):
        return torch.device("cpu" if simulator_enabled() else "cuda")

    @pytest.fixture
    def refused(self):
        return [] if simulator_enabled() else [(torch.device("cpu"), torch.float32)]
