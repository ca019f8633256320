"""Registers the ``fcfs`` and ``priority`` scheduler policies."""

from __future__ import annotations

from hetero_core.hookspecs import Register, hookimpl
from hetero_schedulers.policies import FcfsPolicy, PriorityPolicy


@hookimpl
def register_scheduler_policies(register: Register) -> None:
    register("fcfs", FcfsPolicy)
    register("priority", PriorityPolicy)
