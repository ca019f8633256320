"""Registers the ``torch`` executor."""

from __future__ import annotations

from hetero_core.hookspecs import Register, hookimpl
from hetero_executor_torch.executor import TorchExecutor


@hookimpl
def register_executors(register: Register) -> None:
    register("torch", TorchExecutor)
