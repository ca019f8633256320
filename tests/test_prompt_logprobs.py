"""Prompt logprobs through the engine: every position once, in order, whatever chunking, caching, preemption or n."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hetero_core.batch import ExecutionOutput
from hetero_core.builtin.mock_executor import MockExecutor
from hetero_core.hookspecs import hookimpl
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason

from .test_engine_faults import POISON, FaultyExecutorPlugin, engine_with

PROMPT = "The quick brown fox jumps over the lazy dog, twice."  # 52 tokens: 13 blocks of 4
SCORE = GenerationParams(max_tokens=0, prompt_logprobs=2)


def scores(record) -> list[tuple[int, float, int]]:
    return [(e.token_id, e.logprob, e.rank) for e in record.prompt_logprobs[1:]]


class SpyPlugin:
    """The mock executor, recording every sequence it is given."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    @hookimpl
    def register_executors(self, register) -> None:
        seen = self.seen

        class Spy(MockExecutor):
            def execute(self, batch):
                seen.extend(batch.sequences)
                return super().execute(batch)

        register("spy", lambda config, **options: Spy(**options))


def test_max_tokens_zero_scores_the_prompt_without_sampling() -> None:
    spy = SpyPlugin()
    engine = engine_with((spy, "spy"), executor="spy")
    record = engine.generate([PROMPT], SCORE)[0]
    assert record.finish_reason is FinishReason.LENGTH and record.output_text == "" and record.generated_tokens == []
    assert record.prompt_logprobs[0] is None and len(record.prompt_logprobs) == len(record.input_tokens)
    assert [e.token_id for e in record.prompt_logprobs[1:]] == record.input_tokens[1:]
    assert all(len(e.top) == 2 and e.rank >= 1 and e.logprob <= 0 for e in record.prompt_logprobs[1:])
    assert not any(s.do_sample for s in spy.seen), "a request with max_tokens 0 must not sample"
    assert engine.get_memory_stats().used_blocks == 0


def test_chunked_prefill_gives_the_same_prompt_logprobs(make_engine) -> None:
    whole = make_engine().generate([PROMPT], SCORE)[0]
    chunked_engine = make_engine(max_total_tokens=5, max_batch_size=2)
    chunked = chunked_engine.generate([PROMPT, "another prompt to share the steps"], SCORE)[0]
    assert chunked_engine.metrics.num_steps > 10
    assert scores(chunked) == scores(whole)


def test_preemption_does_not_repeat_prompt_logprobs(make_engine) -> None:
    params = GenerationParams(max_tokens=40, ignore_eos=True, prompt_logprobs=1, temperature=0.0)
    calm = make_engine().generate([PROMPT], params)[0]
    engine = make_engine(max_num_blocks=30, max_model_len=120)
    records = engine.generate([PROMPT, PROMPT + " Again and again.", "A third prompt, to crowd the pool."], params)
    assert engine.metrics.num_preemptions > 0
    assert scores(records[0]) == scores(calm) and records[0].generated_tokens == calm.generated_tokens
    for record in records:  # each position once, though preempted samples compute their prompt again
        assert [e.token_id for e in record.prompt_logprobs[1:]] == record.input_tokens[1:]


def test_parallel_samples_share_one_scoring_sent_once(make_engine) -> None:
    engine = make_engine()
    deltas = list(engine.stream(PROMPT, GenerationParams(max_tokens=3, n=3, prompt_logprobs=1)))
    carrying = [d for d in deltas if d.prompt_logprobs is not None]
    assert len(carrying) == 1 and carrying[0] is deltas[0]
    record = engine.generate([PROMPT], GenerationParams(max_tokens=3, n=3, prompt_logprobs=1))[0]
    assert [e.token_id for e in carrying[0].prompt_logprobs[1:]] == [e.token_id for e in record.prompt_logprobs[1:]]
    assert len(record.outputs) == 3


def test_n_samples_with_max_tokens_zero_all_finish_empty(make_engine) -> None:
    record = make_engine().generate([PROMPT], GenerationParams(max_tokens=0, n=2, prompt_logprobs=0))[0]
    assert [(o.text, o.token_ids, o.finish_reason) for o in record.outputs] == [("", [], FinishReason.LENGTH)] * 2
    assert len(record.prompt_logprobs) == len(record.input_tokens)


def test_a_one_token_prompt_has_only_the_null_entry(make_engine) -> None:
    assert make_engine().generate(["x"], SCORE)[0].prompt_logprobs == [None]


def test_requests_that_do_not_ask_get_none(make_engine) -> None:
    assert make_engine().generate([PROMPT], GenerationParams(max_tokens=2))[0].prompt_logprobs is None


def _spoil_entries(change):
    def spoil(output: ExecutionOutput, seq_id: int) -> None:
        change(output.prompt_logprobs[seq_id])

    return spoil


def _set_first(**values):
    def change(entries) -> None:
        for name, value in values.items():
            setattr(entries[0], name, value)

    return _spoil_entries(change)


@pytest.mark.parametrize(
    ("spoil", "error"),
    [
        (_spoil_entries(list.pop), "returned 1 prompt logprobs, not one for each of the 2 prompt positions"),
        (_set_first(logprob=math.nan), "prompt logprob nan at position 1, not a finite number <= 0"),
        (_set_first(logprob=0.5), "not a finite number <= 0"),
        (_set_first(token_id=7), "not the TokenLogprobs of token 1"),
        (_set_first(rank=None), "rank None at prompt position 1"),
        (_set_first(top=[]), "returned 0 top logprobs, not 2 at prompt position 1"),
    ],
)
def test_malformed_prompt_logprobs_fail_their_request_alone(spoil, error: str) -> None:
    engine = engine_with((FaultyExecutorPlugin(spoil), "faulty"), executor="faulty")
    params = GenerationParams(temperature=0.0, max_tokens=4, prompt_logprobs=2)
    bad = engine.submit_request([POISON, 1, 2], params)
    good = engine.submit_request("well formed", params)
    records = {r.request_id: r for r in engine.run()}
    assert records[bad].finish_reason is FinishReason.ERROR and error in records[bad].error
    assert records[good].finish_reason is FinishReason.LENGTH and len(records[good].prompt_logprobs) == 11
    assert engine.get_memory_stats().used_blocks == 0
