"""Shared fixtures: small engines on the mock executor and the simple tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine


def mock_config(**overrides: Any) -> EngineConfig:
    """An engine config for the byte-level tokenizer and the deterministic mock executor."""
    values: dict[str, Any] = dict(
        tokenizer="simple",
        executor="mock",
        scheduler="fcfs",
        cache_allocator="paged",
        block_size=4,
        max_num_blocks=64,
    )
    values.update(overrides)
    return EngineConfig.from_mapping(values)


@pytest.fixture
def make_engine():
    engines: list[InferenceEngine] = []

    def make(**overrides: Any) -> InferenceEngine:
        engine = InferenceEngine(mock_config(**overrides))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
