"""Registers the ``ngram`` speculator."""

from __future__ import annotations

from hetero_core.hookspecs import Register, hookimpl
from hetero_speculators.ngram import NgramOptions, NgramSpeculator


@hookimpl
def register_speculators(register: Register) -> None:
    register("ngram", NgramSpeculator, options=NgramOptions)
