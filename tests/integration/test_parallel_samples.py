"""``n > 1``: sibling samples of one prompt, checked against outputs recorded before they shared blocks.

``parallel_samples.json`` holds, for ``n`` = 1..8, the seeded samples the
engine produced when ``n > 1`` forked one sequence and copied its partly
filled block on write: on the mock executor over the ``paged`` allocator
(prefix caching on and off, block sizes 4 and 16, chunked prefill), and on
the embedded SmolLM2 with the torch executor. Sibling samples must produce
the same tokens. Run this module as a script to record the file again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.params import GenerationParams

GOLDEN = Path(__file__).parent / "data" / "parallel_samples.json"
SAMPLES = range(1, 9)

MOCK_PROMPTS = {"aligned": "share this prompt please", "ragged": "share this prompt pleas", "short": "abc"}
MOCK_CONFIGS: dict[str, dict[str, Any]] = {
    "cached": {},
    "uncached": {"cache_allocator": {"name": "paged", "enable_prefix_caching": False}},
    "block16": {"block_size": 16},
    "chunked": {"max_total_tokens": 7, "cache_allocator": {"name": "paged", "enable_prefix_caching": False}},
}
MODEL_PROMPT = (
    "The old lighthouse keeper climbed the spiral stairs every evening, counting each of the one hundred"
    " and twelve steps, and at the top he lit the lamp and watched the ships pass in the dark. One night"
)


def mock_engine(**overrides: Any) -> InferenceEngine:
    values: dict[str, Any] = dict(
        tokenizer="simple", executor="mock", scheduler="fcfs", cache_allocator="paged", block_size=4, max_num_blocks=96
    )
    values.update(overrides)
    return InferenceEngine(EngineConfig.from_mapping(values))


def samples(engine: InferenceEngine, prompt: str, params: GenerationParams) -> list[list[int]]:
    record = engine.generate([prompt], params)[0]
    assert [o.index for o in record.outputs] == list(range(params.n))
    return [o.token_ids for o in record.outputs]


def mock_samples(config: str, prompt: str, n: int) -> list[list[int]]:
    engine = mock_engine(**MOCK_CONFIGS[config])
    try:
        return samples(engine, MOCK_PROMPTS[prompt], GenerationParams(temperature=1.0, max_tokens=10, n=n, seed=7))
    finally:
        engine.close()


def model_samples(engine: InferenceEngine, n: int) -> list[list[int]]:
    return samples(engine, MODEL_PROMPT, GenerationParams(temperature=0.8, top_p=0.95, max_tokens=8, n=n, seed=11))


def model_engine() -> InferenceEngine:
    return InferenceEngine(EngineConfig(max_num_blocks=128))


def record() -> dict[str, Any]:
    mock = {f"{config}/{prompt}/{n}": mock_samples(config, prompt, n) for config in MOCK_CONFIGS for prompt in MOCK_PROMPTS for n in SAMPLES}
    engine = model_engine()
    try:
        model = {str(n): model_samples(engine, n) for n in SAMPLES}
    finally:
        engine.close()
    return {"mock": mock, "model": model}


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("n", SAMPLES)
@pytest.mark.parametrize("prompt", MOCK_PROMPTS)
@pytest.mark.parametrize("config", MOCK_CONFIGS)
def test_mock_samples_are_the_recorded_ones(golden, config: str, prompt: str, n: int) -> None:
    assert mock_samples(config, prompt, n) == golden["mock"][f"{config}/{prompt}/{n}"]


@pytest.mark.model
def test_model_samples_are_the_recorded_ones(golden) -> None:
    engine = model_engine()
    try:
        assert {str(n): model_samples(engine, n) for n in SAMPLES} == golden["model"]
    finally:
        engine.close()


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(record(), indent=None, separators=(",", ":")) + "\n")
    sys.exit(0)
