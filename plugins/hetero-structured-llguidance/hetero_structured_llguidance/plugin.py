"""Registers the ``llguidance`` structured-output backend."""

from __future__ import annotations

from hetero_core.hookspecs import Register, hookimpl
from hetero_structured_llguidance.backend import LLGuidanceBackend


@hookimpl
def register_structured_output_backends(register: Register) -> None:
    register("llguidance", LLGuidanceBackend)
