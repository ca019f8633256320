"""The plugin module named by the entry point: registers the ``sjf`` policy."""

from hetero_core.hookspecs import Register, hookimpl
from hetero_sjf_scheduler.policy import ShortestPromptFirst


@hookimpl
def register_scheduler_policies(register: Register) -> None:
    register("sjf", ShortestPromptFirst)
