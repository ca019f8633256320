"""The ``torch`` executor for hetero-infer: Llama-family models over a paged KV cache."""

from hetero_executor_torch import attention_backend
from hetero_executor_torch.attention_backend import AttentionBackend
from hetero_executor_torch.executor import TorchExecutor
from hetero_executor_torch.sampling import Sampler

__all__ = ["AttentionBackend", "Sampler", "TorchExecutor", "attention_backend"]
