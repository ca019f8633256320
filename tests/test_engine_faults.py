"""No request harms another: faulty executor output, raising observers, bad policies and leaking allocators."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

import attrs
import pytest

from hetero_core.batch import ExecutionOutput, TokenLogprobs
from hetero_core.builtin.mock_executor import MockExecutor
from hetero_core.engine import InferenceEngine
from hetero_core.errors import ConfigError, SchedulerError
from hetero_core.hookspecs import hookimpl
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason
from hetero_core.testing.reference import ReferenceAllocator

from .conftest import core_plugin_manager, mock_config

GREEDY = GenerationParams(temperature=0.0, max_tokens=8)
POISON = 255  # a prompt holding this token makes the faulty executors misbehave on its sequence


def engine_with(*plugins: tuple[Any, str], **overrides: Any) -> InferenceEngine:
    """An engine on the reference components plus inline ``plugins`` (object, name)."""
    return InferenceEngine(mock_config(**overrides), plugin_manager=core_plugin_manager(*plugins))


class FaultyExecutorPlugin:
    """The mock executor, with ``spoil(output, seq_id)`` applied to each poisoned sampled sequence."""

    def __init__(self, spoil: Callable[[ExecutionOutput, int], None]) -> None:
        self.spoil = spoil

    @hookimpl
    def register_executors(self, register) -> None:
        spoil = self.spoil

        class Faulty(MockExecutor):
            def execute(self, batch):
                output = super().execute(batch)
                for seq in batch.sequences:
                    if seq.do_sample and POISON in seq.all_token_ids[: seq.num_prompt_tokens]:
                        spoil(output, seq.seq_id)
                return output

        register("faulty", lambda config, **options: Faulty(**options))


def report_error(output: ExecutionOutput, seq_id: int) -> None:
    del output.sampled_token_ids[seq_id]
    output.errors[seq_id] = "cannot handle this sequence"


def set_token(value: Any) -> Callable[[ExecutionOutput, int], None]:
    def spoil(output: ExecutionOutput, seq_id: int) -> None:
        output.sampled_token_ids[seq_id] = value

    return spoil


def omit_token(output: ExecutionOutput, seq_id: int) -> None:
    del output.sampled_token_ids[seq_id]


def nan_logprob(output: ExecutionOutput, seq_id: int) -> None:
    output.logprobs[seq_id].logprob = math.nan


def foreign_logprobs(output: ExecutionOutput, seq_id: int) -> None:
    output.logprobs[seq_id] = TokenLogprobs(output.sampled_token_ids[seq_id] + 1, -1.0, output.logprobs[seq_id].top)


@pytest.mark.parametrize(
    ("spoil", "error"),
    [
        (report_error, "cannot handle this sequence"),
        (omit_token, "executor plugin 'faulty' returned no token and no error"),
        (set_token(None), "returned no token"),
        (set_token("7"), "returned a str token '7', not an int"),
        (set_token(10**6), "returned token 1000000, outside the vocabulary [0, 259)"),
        (set_token(-1), "outside the vocabulary"),
        (nan_logprob, "returned logprob nan, not a finite number <= 0"),
        (foreign_logprobs, "not of the sampled token"),
    ],
)
def test_a_faulty_sequence_fails_alone(spoil, error: str) -> None:
    engine = engine_with((FaultyExecutorPlugin(spoil), "faulty"), executor="faulty")
    params = GenerationParams(temperature=0.0, max_tokens=8, logprobs=2)
    alone = engine.generate(["well formed"], params)[0]
    good = engine.submit_request("well formed", params)
    bad = engine.submit_request([POISON, 1, 2], params)
    other = engine.submit_request("another one", params)
    records = {r.request_id: r for r in engine.run()}
    assert records[bad].finish_reason is FinishReason.ERROR and error in records[bad].error
    assert records[good].generated_tokens == alone.generated_tokens
    assert records[other].finish_reason is FinishReason.LENGTH
    assert engine.get_memory_stats().used_blocks == 0


def test_an_executor_returning_the_wrong_type_fails_its_batch_by_name() -> None:
    class WrongType:
        @hookimpl
        def register_executors(self, register) -> None:
            class Executor(MockExecutor):
                def execute(self, batch):
                    return {"tokens": [1]}

            register("wrong", lambda config, **options: Executor(**options))

    engine = engine_with((WrongType(), "wrong-type"), executor="wrong")
    record = engine.generate(["x"], GREEDY)[0]
    assert record.finish_reason is FinishReason.ERROR
    assert "executor plugin 'wrong-type' returned dict, not an ExecutionOutput" in record.error


class RaisingObserver:
    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def on_step_finished(self, engine, stats) -> None:
        self.calls += 1
        raise RuntimeError("step observer broke")

    @hookimpl
    def on_request_finished(self, engine, completed) -> None:
        raise ValueError("finish observer broke")


def test_raising_observers_lose_nothing_and_are_logged_by_name(caplog) -> None:
    seen = []

    class Watcher:
        @hookimpl
        def on_request_finished(self, engine, completed) -> None:
            seen.append(completed.request_id)

    observer = RaisingObserver()
    engine = engine_with((Watcher(), "watcher"), (observer, "broken-observer"))
    with caplog.at_level(logging.ERROR):
        records = engine.generate(["one", "two"], GREEDY)
    assert [r.finish_reason for r in records] == [FinishReason.LENGTH] * 2
    assert sorted(seen) == sorted(r.request_id for r in records)  # the other observer still ran
    assert observer.calls == 8
    messages = [r.getMessage() for r in caplog.records]
    assert any("observer hook failed" in m and "broken-observer" in m and "on_step_finished" in m for m in messages)
    assert any("broken-observer" in m and "finish observer broke" in m for m in messages)


class PolicyPlugin:
    def __init__(self, order: Callable[[list], Any], victim: Callable[[list], Any]) -> None:
        self.order, self.victim = order, victim

    @hookimpl
    def register_scheduler_policies(self, register) -> None:
        plugin = self

        class Policy:
            def order(self, seqs):
                return plugin.order(list(seqs))

            def choose_victim(self, running):
                return plugin.victim(list(running))

        register("odd", lambda **options: Policy())


@pytest.mark.parametrize(
    ("order", "victim", "match"),
    [
        (lambda w: w + w[:1], lambda r: r[-1], "order must return a permutation of the 2 sequences.*got 3 items"),
        (lambda w: None, lambda r: r[-1], "order must return a permutation.*got NoneType"),
        (lambda w: w, lambda r: None, "choose_victim must return one of the"),
    ],
)
def test_a_policy_that_breaks_its_contract_is_named(order, victim, match: str) -> None:
    engine = engine_with((PolicyPlugin(order, victim), "odd-policy"), scheduler="odd", max_num_blocks=4)
    for prompt in ("a" * 6, "b" * 6):
        engine.submit_request(prompt, GenerationParams(temperature=0.0, max_tokens=9))
    with pytest.raises(SchedulerError, match=f"scheduler policy plugin 'odd-policy': {match}"):
        engine.run()


def test_a_leaking_allocator_is_reported_by_name(caplog) -> None:
    class Leaky(ReferenceAllocator):
        def free(self, seq_id: int) -> None:
            pass

    class LeakyPlugin:
        @hookimpl
        def register_cache_allocators(self, register) -> None:
            register("leaky", Leaky)

    engine = engine_with((LeakyPlugin(), "leaky-allocator"), cache_allocator="leaky")
    with caplog.at_level(logging.ERROR):
        engine.generate(["leak"], GREEDY)
        engine.generate(["leak again"], GREEDY)
    leaks = [r.getMessage() for r in caplog.records if "leaks blocks" in r.getMessage()]
    assert len(leaks) == 1 and "leaky-allocator" in leaks[0]


class EndsOn:
    """An executor plugin whose model ends generation on ``eos_token_ids`` and always answers ``answer``."""

    def __init__(self, eos_token_ids: tuple, answer: int) -> None:
        self.eos_token_ids, self.answer = eos_token_ids, answer

    @hookimpl
    def register_executors(self, register) -> None:
        plugin = self

        class Ending(MockExecutor):
            @property
            def model_info(self):
                return attrs.evolve(super().model_info, eos_token_ids=plugin.eos_token_ids)

            def execute(self, batch):
                output = super().execute(batch)
                return ExecutionOutput({seq_id: plugin.answer for seq_id in output.sampled_token_ids})

        register("ending", lambda config, **options: Ending(**options))


def test_every_end_of_sequence_id_of_the_model_ends_generation() -> None:
    engine = engine_with((EndsOn((3, 4), answer=4), "ending"), executor="ending")
    try:
        (record,) = engine.generate(["x"], GREEDY)
        assert record.finish_reason is FinishReason.STOP and record.generated_tokens == [4]
        (ignoring,) = engine.generate(["x"], GenerationParams(temperature=0.0, max_tokens=3, ignore_eos=True))
        assert ignoring.finish_reason is FinishReason.LENGTH and ignoring.generated_tokens == [4, 4, 4]
    finally:
        engine.close()


def test_an_end_of_sequence_id_outside_the_vocabulary_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match="executor plugin 'ending' names end-of-sequence id 9999, outside its vocabulary"
    ):
        engine_with((EndsOn((9999,), answer=1), "ending"), executor="ending")
