"""Registers the ``llguidance`` structured-output backend (llguidance loads when a backend is built)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from hetero_core.errors import ConfigError
from hetero_core.hookspecs import Register, hookimpl
from hetero_core.validators import boolean, number_in
from hetero_structured_llguidance.limits import MAX_MASK_THREADS, GrammarLimits

if TYPE_CHECKING:
    from hetero_structured_llguidance.backend import LLGuidanceBackend

DEFAULT_LIMITS = GrammarLimits()


def _bound(default: int) -> int:
    return attrs.field(default=default, validator=number_in(1, 2**31 - 1, integer=True, error=ConfigError))


@attrs.frozen
class LLGuidanceOptions:
    """The ``llguidance`` backend's options (see :class:`LLGuidanceBackend` and :class:`GrammarLimits`)."""

    whitespace_flexible: bool = attrs.field(default=False, validator=boolean(error=ConfigError))
    max_cached_grammars: int = attrs.field(default=256, validator=number_in(1, 2**20, integer=True, error=ConfigError))
    mask_threads: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(number_in(1, MAX_MASK_THREADS, integer=True, error=ConfigError)),
    )
    max_grammar_size: int = _bound(DEFAULT_LIMITS.max_grammar_size)
    compile_fuel: int = _bound(DEFAULT_LIMITS.compile_fuel)
    max_items_in_row: int = _bound(DEFAULT_LIMITS.max_items_in_row)
    step_max_items: int = _bound(DEFAULT_LIMITS.step_max_items)


def llguidance_backend(
    tokenizer: Any,
    *,
    whitespace_flexible: bool = False,
    max_cached_grammars: int = 256,
    mask_threads: int | None = None,
    **limits: int,
) -> LLGuidanceBackend:
    from hetero_structured_llguidance.backend import LLGuidanceBackend

    return LLGuidanceBackend(
        tokenizer,
        whitespace_flexible=whitespace_flexible,
        max_cached_grammars=max_cached_grammars,
        mask_threads=mask_threads,
        limits=GrammarLimits(**limits),
    )


@hookimpl
def register_structured_output_backends(register: Register) -> None:
    register("llguidance", llguidance_backend, options=LLGuidanceOptions)
