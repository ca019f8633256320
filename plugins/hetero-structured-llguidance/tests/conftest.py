"""Fixtures: the embedded model's tokenizer and an llguidance backend over it."""

from __future__ import annotations

import pytest

from hetero_core.model_source import resolve_model_path
from hetero_structured_llguidance import LLGuidanceBackend
from hetero_tokenizer_hf import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model_path(None))


@pytest.fixture(scope="module")
def backend(tokenizer):
    return LLGuidanceBackend(tokenizer)
