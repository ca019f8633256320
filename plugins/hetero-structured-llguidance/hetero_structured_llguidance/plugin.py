"""Registers the ``llguidance`` structured-output backend."""

from __future__ import annotations

import attrs

from hetero_core.errors import ConfigError
from hetero_core.hookspecs import Register, hookimpl
from hetero_core.validators import boolean, number_in
from hetero_structured_llguidance.backend import LLGuidanceBackend


@attrs.frozen
class LLGuidanceOptions:
    """The ``llguidance`` backend's options (see :class:`LLGuidanceBackend`)."""

    whitespace_flexible: bool = attrs.field(default=False, validator=boolean(error=ConfigError))
    max_cached_grammars: int = attrs.field(default=256, validator=number_in(1, 2**20, integer=True, error=ConfigError))


@hookimpl
def register_structured_output_backends(register: Register) -> None:
    register("llguidance", LLGuidanceBackend, options=LLGuidanceOptions)
