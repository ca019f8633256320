"""The plugin module named by the entry point: registers the ``sjf`` policy and its options."""

import attrs

from hetero_core.errors import ConfigError
from hetero_core.hookspecs import Register, hookimpl
from hetero_core.validators import number_in
from hetero_sjf_scheduler.policy import ShortestPromptFirst


@attrs.frozen
class SjfOptions:
    """The options of ``sjf`` (config: ``"scheduler": {"name": "sjf", "aging": 4}``), checked before the policy is
    built."""

    aging: int = attrs.field(default=8, validator=number_in(1, 10**6, integer=True, error=ConfigError))


@hookimpl
def register_scheduler_policies(register: Register) -> None:
    register("sjf", ShortestPromptFirst, options=SjfOptions)
