"""Structured output for hetero-infer on the llguidance grammar engine."""

from hetero_structured_llguidance.backend import LLGuidanceBackend, LLGuidanceMatcher

__all__ = ["LLGuidanceBackend", "LLGuidanceMatcher"]
