"""Registers the ``fcfs``, ``priority`` and ``lpm`` scheduler policies."""

from __future__ import annotations

import attrs

from hetero_core.errors import ConfigError
from hetero_core.hookspecs import Register, hookimpl
from hetero_core.validators import number_in
from hetero_schedulers.policies import FcfsPolicy, LongestPrefixMatchPolicy, PriorityPolicy


@attrs.frozen
class NoOptions:
    """The policies take no options."""


@attrs.frozen
class LpmOptions:
    """The options of ``lpm`` (config: ``"scheduler": {"name": "lpm", "max_overtakes": 64}``)."""

    max_overtakes: int = attrs.field(default=64, validator=number_in(0, 2**31 - 1, integer=True, error=ConfigError))


@hookimpl
def register_scheduler_policies(register: Register) -> None:
    register("fcfs", FcfsPolicy, options=NoOptions)
    register("priority", PriorityPolicy, options=NoOptions)
    register("lpm", LongestPrefixMatchPolicy, options=LpmOptions)
