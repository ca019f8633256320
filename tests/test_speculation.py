"""Speculative decoding in the engine loop, on the mock executor: the output is plain decoding's, token for token."""

from __future__ import annotations

import logging
import random

import pytest

from hetero_core.engine import InferenceEngine
from hetero_core.errors import ConfigError
from hetero_core.hookspecs import hookimpl
from hetero_core.params import GenerationParams
from hetero_core.speculation import ProposalRequest

from .conftest import core_plugin_manager, mock_config

PROMPTS = ["speculate on this", "a second, longer prompt for the engine", "x"]


class OracleSpeculator:
    """Proposes the plain run's continuation of each prompt, with some tokens wrong (seeded)."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], error_rate: float, k: int) -> None:
        self.continuations = continuations
        self.rng = random.Random(0)
        self.error_rate = error_rate
        self.k = k
        self.asked: list[tuple[int, int, int]] = []  # seq_id, output tokens so far, max_proposals
        self.observed: list[tuple[int, int, int]] = []
        self.freed: list[int] = []

    def propose(self, requests: list[ProposalRequest]) -> list[list[int]]:
        proposals = []
        for request in requests:
            known = self.continuations.get(tuple(request.token_ids[: request.num_prompt_tokens]), [])
            done = len(request.token_ids) - request.num_prompt_tokens
            self.asked.append((request.seq_id, done, request.max_proposals))
            proposal = known[done : done + min(self.k, request.max_proposals)]
            proposals.append([(t + 1) % 250 if self.rng.random() < self.error_rate else t for t in proposal])
        return proposals

    def observe(self, seq_id: int, num_proposed: int, num_accepted: int) -> None:
        self.observed.append((seq_id, num_proposed, num_accepted))

    def free(self, seq_id: int) -> None:
        self.freed.append(seq_id)

    def close(self) -> None:
        pass


def engine_with(speculator: object, **overrides) -> InferenceEngine:
    class Plugin:
        @hookimpl
        def register_speculators(self, register) -> None:
            register("test", lambda config, model_info, components: speculator)

    config = mock_config(speculator="test", **overrides)
    return InferenceEngine(config, plugin_manager=core_plugin_manager((Plugin(), "test-speculator")))


def plain_and_speculative(params: GenerationParams, error_rate: float = 0.3, k: int = 4, **overrides):
    """The records of PROMPTS decoded plainly and with an oracle speculator, and the speculative engine."""
    plain_engine = InferenceEngine(mock_config(**overrides), plugin_manager=core_plugin_manager())
    plain = plain_engine.generate(PROMPTS, params)
    plain_engine.close()
    oracle = OracleSpeculator(
        {tuple(r.input_tokens): r.outputs[0].token_ids for r in plain}, error_rate=error_rate, k=k
    )
    engine = engine_with(oracle, **overrides)
    return plain, engine.generate(PROMPTS, params), engine, oracle


def tokens_of(records) -> list[list[list[int]]]:
    return [[o.token_ids for o in r.outputs] for r in records]


@pytest.mark.parametrize("error_rate", [0.0, 0.3, 1.0])
def test_greedy_output_is_plain_decodings(error_rate: float) -> None:
    plain, speculative, engine, oracle = plain_and_speculative(
        GenerationParams(temperature=0.0, max_tokens=24), error_rate
    )
    assert tokens_of(speculative) == tokens_of(plain)
    assert [r.outputs[0].text for r in speculative] == [r.outputs[0].text for r in plain]
    metrics = engine.metrics
    assert metrics.speculative_verifications == len(oracle.observed) > 0
    assert metrics.speculative_proposed_tokens == sum(p for _, p, _ in oracle.observed)
    assert metrics.speculative_accepted_tokens == sum(a for _, _, a in oracle.observed)
    if error_rate == 0.0:
        assert metrics.speculative_accepted_tokens == metrics.speculative_proposed_tokens
        assert metrics.num_steps < 24  # several tokens a step
    if error_rate == 1.0:
        assert metrics.speculative_accepted_tokens == 0
    assert engine.get_memory_stats().used_blocks == 0
    assert sorted(oracle.freed) == sorted({seq_id for seq_id, _, _ in oracle.asked})
    engine.close()


def test_proposals_stay_within_the_requests_room() -> None:
    _, speculative, engine, oracle = plain_and_speculative(GenerationParams(temperature=0.0, max_tokens=7), k=16)
    assert all(len(r.generated_tokens) == 7 for r in speculative)
    assert oracle.asked
    for _, done, max_proposals in oracle.asked:
        assert 1 <= max_proposals == 7 - done - 1
    engine.close()


@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(temperature=0.8, seed=11, max_tokens=20),
        GenerationParams(temperature=0.0, max_tokens=20, logprobs=3),
        GenerationParams(temperature=0.0, max_tokens=30, stop=["q"], include_stop_str_in_output=True),
        GenerationParams(temperature=0.7, max_tokens=16, n=3, seed=5),
        GenerationParams(temperature=0.0, max_tokens=20, logit_bias={100: -100.0, 101: -100.0}),
    ],
    ids=["seeded", "logprobs", "stop", "n3", "bias"],
)
def test_every_request_shape_keeps_plain_output(params: GenerationParams) -> None:
    plain, speculative, engine, _ = plain_and_speculative(params)
    assert tokens_of(speculative) == tokens_of(plain)
    assert [[o.text for o in r.outputs] for r in speculative] == [[o.text for o in r.outputs] for r in plain]
    assert [[o.finish_reason for o in r.outputs] for r in speculative] == [
        [o.finish_reason for o in r.outputs] for r in plain
    ]
    if params.logprobs:
        assert [[o.logprobs for o in r.outputs] for r in speculative] == [
            [o.logprobs for o in r.outputs] for r in plain
        ]
    assert engine.metrics.speculative_accepted_tokens > 0
    assert engine.get_memory_stats().used_blocks == 0
    engine.close()


def test_a_small_pool_and_budget_drop_proposals_rather_than_preempt() -> None:
    params = GenerationParams(temperature=0.0, max_tokens=40)
    plain, speculative, engine, _ = plain_and_speculative(
        params, error_rate=0.2, k=8, max_num_blocks=40, max_total_tokens=6
    )
    assert tokens_of(speculative) == tokens_of(plain)
    assert engine.get_memory_stats().used_blocks == 0
    engine.close()


def test_preempted_sequences_keep_plain_output() -> None:
    params = GenerationParams(temperature=0.0, max_tokens=40)
    plain, speculative, engine, _ = plain_and_speculative(params, error_rate=0.2, k=6, max_num_blocks=24)
    assert engine.metrics.num_preemptions > 0
    assert tokens_of(speculative) == tokens_of(plain)
    assert engine.get_memory_stats().used_blocks == 0
    engine.close()


class RaisingSpeculator(OracleSpeculator):
    def propose(self, requests: list[ProposalRequest]) -> list[list[int]]:
        raise RuntimeError("the guesser broke")


class OutOfVocabulary(OracleSpeculator):
    def propose(self, requests: list[ProposalRequest]) -> list[list[int]]:
        return [[10**6] for _ in requests]


class TooMany(OracleSpeculator):
    def propose(self, requests: list[ProposalRequest]) -> list[list[int]]:
        return [[1] * (r.max_proposals + 1) for r in requests]


@pytest.mark.parametrize(
    ("speculator_class", "problem"),
    [
        (RaisingSpeculator, "propose raised RuntimeError: the guesser broke"),
        (OutOfVocabulary, "outside the vocabulary"),
        (TooMany, "not a list of at most"),
    ],
)
def test_a_faulty_speculator_is_turned_off_and_output_stays_right(
    speculator_class: type, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    params = GenerationParams(temperature=0.0, max_tokens=12)
    plain_engine = InferenceEngine(mock_config(), plugin_manager=core_plugin_manager())
    plain = plain_engine.generate(PROMPTS, params)
    plain_engine.close()
    engine = engine_with(speculator_class({}, 0.0, 4))
    with caplog.at_level(logging.ERROR):
        assert tokens_of(engine.generate(PROMPTS, params)) == tokens_of(plain)
    assert not engine.speculation.is_on
    assert any(problem in r.getMessage() and "test-speculator" in r.getMessage() for r in caplog.records)
    engine.close()


def test_an_executor_that_cannot_verify_is_refused_by_name() -> None:
    class PlainExecutor:
        @hookimpl
        def register_executors(self, register) -> None:
            from hetero_core.builtin.mock_executor import MockExecutor

            class NoVerify(MockExecutor):
                verifies_proposals = False

            register("no-verify", NoVerify)

    class Plugin:
        @hookimpl
        def register_speculators(self, register) -> None:
            register("test", lambda config, model_info, components: OracleSpeculator({}, 0.0, 2))

    pm = core_plugin_manager((PlainExecutor(), "plain-executor"), (Plugin(), "test-speculator"))
    with pytest.raises(ConfigError, match="executor plugin 'plain-executor' does not .verifies_proposals."):
        InferenceEngine(mock_config(speculator="test", executor="no-verify"), plugin_manager=pm)


def test_an_unknown_speculator_lists_the_installed_ones() -> None:
    with pytest.raises(ConfigError, match="unknown speculator 'nope'; installed: none"):
        InferenceEngine(mock_config(speculator="nope"), plugin_manager=core_plugin_manager())


def bounded_asks(bounds: dict[str, int], prompts: list[str], max_tokens: int) -> list[tuple[int, int, int]]:
    """What an oracle speculator was asked for, ``prompts`` generated on the mock executor with the class
    attributes ``bounds`` (``max_proposals``, ``max_verify_tokens``)."""
    from hetero_core.builtin.mock_executor import MockExecutor

    bounded = type("BoundedExecutor", (MockExecutor,), dict(bounds))

    class Bounded:
        @hookimpl
        def register_executors(self, register) -> None:
            register("bounded", bounded)

    oracle = OracleSpeculator({}, 0.0, 8)

    class Plugin:
        @hookimpl
        def register_speculators(self, register) -> None:
            register("test", lambda config, model_info, components: oracle)

    pm = core_plugin_manager((Bounded(), "bounded"), (Plugin(), "test-speculator"))
    engine = InferenceEngine(mock_config(speculator="test", executor="bounded"), plugin_manager=pm)
    try:
        engine.generate(prompts, GenerationParams(temperature=0.0, max_tokens=max_tokens))
    finally:
        engine.close()
    return oracle.asked


@pytest.mark.parametrize(("prompts", "share"), [(1, 5), (3, 1), (6, 0)])
def test_the_executors_max_verify_tokens_is_shared_among_the_decoding_sequences(prompts: int, share: int) -> None:
    """Six tokens a step: one decoding sequence may carry five proposals, three one each, six none at all
    (the step stays plain decoding)."""
    asked = bounded_asks({"max_verify_tokens": 6}, [f"prompt {i}" for i in range(prompts)], 20)
    assert max((bound for _, _, bound in asked), default=0) == share


def test_the_executors_max_proposals_bounds_every_request() -> None:
    asked = bounded_asks({"max_proposals": 2}, PROMPTS, 10)
    assert asked and all(max_proposals <= 2 for _, _, max_proposals in asked)
