"""The attention-backend contract kit on the built-in backends."""

from __future__ import annotations

import pytest
import torch

from hetero_executor_torch import TorchAttention
from hetero_executor_torch.kernel_attention import NumbaCpuAttention
from hetero_executor_torch.testing import AttentionBackendContract


class TestTorchAttention(AttentionBackendContract):
    @pytest.fixture
    def backend(self):
        return TorchAttention()


class TestNumbaAttention(AttentionBackendContract):
    @pytest.fixture
    def backend(self):
        return NumbaCpuAttention()

    @pytest.fixture
    def refused(self):
        return [(torch.device("cuda"), torch.float32)]


class TestNumbaAttentionOnBfloat16(TestNumbaAttention):
    """The CPU kernels read a bfloat16 cache as its raw bits."""

    dtype = torch.bfloat16
    tolerance = dict(atol=2e-2, rtol=2e-2)
