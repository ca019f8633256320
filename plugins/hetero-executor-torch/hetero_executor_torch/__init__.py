"""The ``torch`` executor for hetero-infer: Llama-family models over a paged KV cache.

The names below are the package's public API, for other executors, attention
backends and their tests; the submodules are private. ``API_VERSION`` rises
when one of them changes incompatibly (see the README, "Public API").
"""

from hetero_core.step_layout import StepLayout
from hetero_executor_torch.attention import TorchAttention
from hetero_executor_torch.attention_backend import AttentionBackend, AttentionBackends
from hetero_executor_torch.executor import TorchExecutor, resolve_device
from hetero_executor_torch.kernel_attention import KernelAttention
from hetero_executor_torch.plugin import TorchExecutorOptions
from hetero_executor_torch.sampling import Sampler, sample_and_verify, sample_each_alone_on_failure

API_VERSION = 1

__all__ = [
    "API_VERSION",
    "AttentionBackend",
    "AttentionBackends",
    "KernelAttention",
    "Sampler",
    "StepLayout",
    "TorchAttention",
    "TorchExecutor",
    "TorchExecutorOptions",
    "resolve_device",
    "sample_and_verify",
    "sample_each_alone_on_failure",
]
