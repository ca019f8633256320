"""``n > 1``: sibling samples of one prompt sharing its full blocks, against what forking one sequence did.

``parallel_samples.json`` holds, for ``n`` = 1..8, the seeded samples the
engine produced when ``n > 1`` forked one sequence and copied its partly
filled block on write: on the mock executor over the ``paged`` allocator
(prefix caching on and off, block sizes 4 and 16, chunked prefill), and on
the embedded SmolLM2 with the torch executor in float32. Sibling samples
must produce the same tokens, compute the prompt's full blocks once and hold
no more KV blocks than forking did. The model's samples were recorded again
when they moved to float32 (the mock's are still forking's): in bfloat16 a
sample depends on how the CPU's kernels round (the VNNI, AMX and portable
kernels, and torch's own matmuls, differ from one CPU model to the next), in
float32 the same record holds on every host and kernel. Run this module as
a script to record the file again.
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
from hetero_core.sequence import FinishReason

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
    return InferenceEngine(EngineConfig(executor={"name": "torch", "dtype": "float32"}, max_num_blocks=128))


def record() -> dict[str, Any]:
    mock = {
        f"{config}/{prompt}/{n}": mock_samples(config, prompt, n)
        for config in MOCK_CONFIGS
        for prompt in MOCK_PROMPTS
        for n in SAMPLES
    }
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


# Peak KV blocks of n = 8 samples (10 tokens each, block size 4) when they forked, by prompt length.
FORKED_PEAK_BLOCKS = {24: 29, 23: 23, 3: 24, 37: 30}


def computed_prompt_positions(engine: InferenceEngine) -> list[int]:
    """Spy on the executor: the prompt positions it computes, one entry per computation."""
    positions: list[int] = []
    execute = engine.executor.execute

    def spying(batch):
        for seq in batch.sequences:
            start = seq.start_position
            positions.extend(p for p in range(start, start + len(seq.token_ids)) if p < seq.num_prompt_tokens)
        return execute(batch)

    engine.executor.execute = spying
    return positions


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-caching", "no-prefix-caching"])
@pytest.mark.parametrize("length", sorted(FORKED_PEAK_BLOCKS))
@pytest.mark.parametrize("n", [2, 8])
def test_the_prompt_full_blocks_are_computed_once_and_the_blocks_stay_as_few(
    caching: bool, length: int, n: int
) -> None:
    engine = mock_engine(cache_allocator={"name": "paged", "enable_prefix_caching": caching})
    positions = computed_prompt_positions(engine)
    engine.submit_request("y" * length, GenerationParams(temperature=1.0, max_tokens=10, n=n, seed=7))
    peak = 0
    while engine.has_pending_work():
        engine.step()
        peak = max(peak, engine.get_memory_stats().used_blocks)
    num_full = (length - 1) // 4 * 4  # the positions before the last token's block
    assert sorted(positions) == sorted([*range(length), *list(range(num_full, length)) * (n - 1)])
    if n == 8:
        assert peak <= FORKED_PEAK_BLOCKS[length] + n - 1
    assert engine.get_memory_stats().used_blocks == 0
    engine.close()


def test_every_sample_streams_and_completes_with_its_index() -> None:
    engine = mock_engine(cache_allocator={"name": "paged", "enable_prefix_caching": False})
    params = GenerationParams(temperature=1.0, max_tokens=6, n=5, seed=3)
    deltas = list(engine.stream("stream these samples", params))
    record = mock_engine(cache_allocator={"name": "paged", "enable_prefix_caching": False}).generate(
        ["stream these samples"], params
    )[0]
    assert [o.index for o in record.outputs] == list(range(5))
    for output in record.outputs:
        mine = [d for d in deltas if d.index == output.index]
        assert [t for d in mine for t in d.token_ids] == output.token_ids
        assert "".join(d.text for d in mine) == output.text
        assert [d.finish_reason for d in mine if d.finish_reason] == [FinishReason.LENGTH]
    engine.close()


@pytest.mark.parametrize("steps_before", [0, 1, 2, 4])
def test_aborting_a_request_aborts_every_sample_and_frees_every_block(steps_before: int) -> None:
    """Before the first sample computed the prompt, while the others are held, once they share it, while decoding."""
    engine = mock_engine(max_total_tokens=8, cache_allocator={"name": "paged", "enable_prefix_caching": False})
    deltas: list = []
    request_id = engine.submit_request(
        "abort all of these samples", GenerationParams(n=4, max_tokens=20), on_output=deltas.append
    )
    for _ in range(steps_before):
        engine.step()
    assert engine.abort_request(request_id)
    record = engine.run()[0]
    assert [o.index for o in record.outputs] == [0, 1, 2, 3]
    assert all(o.finish_reason is FinishReason.ABORT for o in record.outputs)
    assert sorted(d.index for d in deltas if d.finish_reason is FinishReason.ABORT) == [0, 1, 2, 3]
    assert engine.get_memory_stats().used_blocks == 0 and engine.get_memory_stats().num_sequences == 0
    engine.close()


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-caching", "no-prefix-caching"])
def test_preempted_siblings_give_the_same_samples_and_free_every_block(caching: bool) -> None:
    params = GenerationParams(temperature=1.0, max_tokens=24, n=4, seed=5)
    prompts = ["preempt these samples", "and these ones too"]
    roomy = mock_engine(cache_allocator={"name": "paged", "enable_prefix_caching": caching})
    tight = mock_engine(max_num_blocks=24, cache_allocator={"name": "paged", "enable_prefix_caching": caching})
    expected = [[o.token_ids for o in r.outputs] for r in roomy.generate(prompts, params)]
    assert [[o.token_ids for o in r.outputs] for r in tight.generate(prompts, params)] == expected
    assert tight.metrics.num_preemptions > 0
    stats = tight.get_memory_stats()
    assert stats.used_blocks == 0 and stats.num_sequences == 0
    roomy.close()
    tight.close()


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(record(), indent=None, separators=(",", ":")) + "\n")
    sys.exit(0)
