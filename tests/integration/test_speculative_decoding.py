"""Speculative decoding on the embedded SmolLM2 in float32: prompt lookup changes the speed, never the tokens."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.params import GenerationParams
from hetero_core.structured_output import StructuredOutput

PASSAGE = (
    "The old lighthouse keeper climbed the spiral stairs every evening, counting each of the one hundred"
    " and twelve steps, and at the top he lit the lamp and watched the ships pass in the dark."
)
CODE = "def area(width, height):\n    result = width * height\n    return result\n\n\nprint(area(3, 4))\n"
RECORD = '{"name": "Ada Lovelace", "born": 1815, "city": "London", "field": "mathematics"}'
WORKLOADS = {
    "quote": [{"role": "user", "content": f"Repeat this passage word for word:\n\n{PASSAGE}"}],
    "code": [{"role": "user", "content": f"Rename the function area to rectangle_area:\n\n{CODE}"}],
    "extract": [{"role": "user", "content": f"Give the name and the city from this record as JSON:\n{RECORD}"}],
    "chat": [{"role": "user", "content": "Name three things people do on a rainy afternoon."}],
}
GREEDY = GenerationParams(temperature=0.0, max_tokens=32)


def model_engine(**overrides) -> InferenceEngine:
    return InferenceEngine(
        EngineConfig(
            executor={"name": "torch", "dtype": "float32"}, max_model_len=1024, max_num_blocks=256, **overrides
        )
    )


@pytest.fixture(scope="module")
def plain() -> Iterator[InferenceEngine]:
    engine = model_engine()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def speculative() -> Iterator[InferenceEngine]:
    engine = model_engine(speculator={"name": "ngram", "k": 6, "min_ngram": 1})
    yield engine
    engine.close()


def chat(engine: InferenceEngine, messages, params: GenerationParams):
    engine.submit_chat(messages, params)
    [record] = engine.run()
    return record


def test_greedy_tokens_are_plain_decodings_on_every_workload(plain, speculative) -> None:
    before = speculative.metrics.speculative_accepted_tokens
    for name in ("quote", "code", "chat"):
        messages = WORKLOADS[name]
        expected = chat(plain, messages, GREEDY).outputs[0]
        got = chat(speculative, messages, GREEDY).outputs[0]
        assert got.token_ids == expected.token_ids, name
        assert got.text == expected.text
    metrics = speculative.metrics
    assert metrics.speculative_accepted_tokens - before > 16, "prompt lookup found nothing in text that repeats"
    assert speculative.get_memory_stats().used_blocks == 0


def test_seeded_samples_logprobs_and_siblings_are_plain_decodings(plain, speculative) -> None:
    params = GenerationParams(temperature=0.8, top_p=0.95, seed=3, max_tokens=24, n=2, logprobs=2)
    expected = chat(plain, WORKLOADS["quote"], params)
    got = chat(speculative, WORKLOADS["quote"], params)
    for mine, theirs in zip(got.outputs, expected.outputs, strict=True):
        assert mine.token_ids == theirs.token_ids
        for a, b in zip(mine.logprobs, theirs.logprobs, strict=True):
            assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-3)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_stop_strings_and_structured_output_hold_with_proposals(plain, speculative) -> None:
    stop = GenerationParams(temperature=0.0, max_tokens=40, stop=["ships"])
    assert (
        chat(speculative, WORKLOADS["quote"], stop).outputs[0].text
        == chat(plain, WORKLOADS["quote"], stop).outputs[0].text
    )
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
        "required": ["name", "city"],
        "additionalProperties": False,
    }
    constrained = GenerationParams(
        temperature=0.0, max_tokens=32, structured_output=StructuredOutput.json_schema(schema)
    )
    expected = chat(plain, WORKLOADS["extract"], constrained).outputs[0]
    got = chat(speculative, WORKLOADS["extract"], constrained).outputs[0]
    assert got.token_ids == expected.token_ids
    assert set(json.loads(got.text)) == {"name", "city"}
    assert speculative.get_memory_stats().used_blocks == 0
