"""Registers the ``ngram`` and ``draft`` speculators."""

from __future__ import annotations

from hetero_core.hookspecs import Register, hookimpl
from hetero_speculators.draft import DraftOptions, DraftSpeculator
from hetero_speculators.ngram import NgramOptions, NgramSpeculator


@hookimpl
def register_speculators(register: Register) -> None:
    register("ngram", NgramSpeculator, options=NgramOptions)
    register("draft", DraftSpeculator, options=DraftOptions)
