"""Registers the ``fcfs`` and ``priority`` scheduler policies."""

from __future__ import annotations

import attrs

from hetero_core.hookspecs import Register, hookimpl
from hetero_schedulers.policies import FcfsPolicy, PriorityPolicy


@attrs.frozen
class NoOptions:
    """The policies take no options."""


@hookimpl
def register_scheduler_policies(register: Register) -> None:
    register("fcfs", FcfsPolicy, options=NoOptions)
    register("priority", PriorityPolicy, options=NoOptions)
