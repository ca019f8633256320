"""Structured output for hetero-infer on the llguidance grammar engine.

``LLGuidanceBackend`` and ``LLGuidanceMatcher`` import llguidance, so they load
on first use (``hetero-infer`` loads this plugin for every engine it builds).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLGuidanceBackend", "LLGuidanceMatcher"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hetero_structured_llguidance import backend

        return getattr(backend, name)
    raise AttributeError(f"module 'hetero_structured_llguidance' has no attribute {name!r}")
