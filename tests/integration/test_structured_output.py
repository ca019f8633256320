"""Structured output through the engine: every sample's text satisfies its constraint, whatever the batching.

The mock executor draws arbitrary allowed tokens, so the constraints here have a bounded
language (an unbounded JSON object would rarely end); the real model's tests cover the rest.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_core.builtin.mock_executor import MockExecutor
from hetero_core.errors import ConfigError, ExecutionError, ValidationError
from hetero_core.hookspecs import hookimpl
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason
from hetero_core.structured_output import StructuredOutput
from hetero_core.tool_prompt import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

from ..test_engine_faults import engine_with

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "level": {"enum": ["low", "high"]},
        "n": {"type": "integer"},
    },
    "required": ["name", "level", "n"],
    "additionalProperties": False,
}
PATTERN = r"[a-f]{2,5}-\d{1,3}"
CHOICES = ["red", "green", "blue"]


def check_schema(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "level", "n"}, value
    assert isinstance(value["name"], str) and len(value["name"]) <= 6 and value["level"] in ("low", "high")
    assert isinstance(value["n"], int)


def check_tool_call(text: str) -> None:
    assert text.startswith(TOOL_CALL_OPEN + "\n") and text.endswith("\n" + TOOL_CALL_CLOSE), text
    call = json.loads(text[len(TOOL_CALL_OPEN) : -len(TOOL_CALL_CLOSE)])
    assert call["name"] == "describe", call
    check_schema(json.dumps(call["arguments"]))


CONSTRAINTS = [
    (StructuredOutput.json_schema(SCHEMA), check_schema),
    (StructuredOutput.regex(PATTERN), lambda text: re.fullmatch(PATTERN, text) or pytest.fail(text)),
    (StructuredOutput.choice(CHOICES), lambda text: text in CHOICES or pytest.fail(text)),
    (
        StructuredOutput.grammar(f'start: "#" /{PATTERN}/'),
        lambda text: re.fullmatch("#" + PATTERN, text) or pytest.fail(text),
    ),
    (StructuredOutput.tool_calls({"describe": SCHEMA}), check_tool_call),
]


def grammar_engine(**overrides):
    from hetero_structured_llguidance import plugin as llguidance

    return engine_with((llguidance, "structured-llguidance"), **overrides)


@pytest.fixture(scope="module")
def engine():
    engine = grammar_engine(executor={"name": "mock", "eos_probability": 0.05}, max_num_blocks=256)
    yield engine
    engine.close()


@pytest.mark.parametrize(
    ("constraint", "check"), CONSTRAINTS, ids=["schema", "regex", "choice", "grammar", "tool_call"]
)
def test_every_sample_satisfies_its_constraint(engine, constraint, check) -> None:
    params = GenerationParams(max_tokens=400, temperature=1.0, n=4, seed=3, structured_output=constraint)
    (record,) = engine.generate(["describe it"], params)
    for output in record.outputs:
        assert output.finish_reason is FinishReason.STOP
        check(output.text)
    assert engine.get_memory_stats().used_blocks == 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(0, len(CONSTRAINTS)), min_size=1, max_size=8),
    n=st.integers(1, 3),
    num_blocks=st.integers(48, 96),
)
def test_constraints_hold_under_batching_and_preemption(picks, n, num_blocks) -> None:
    """A small pool preempts and recomputes samples mid-grammar; unconstrained neighbours are unaffected."""
    engine = grammar_engine(max_num_blocks=num_blocks, executor={"name": "mock", "eos_probability": 0.05})
    try:
        ids = []
        for i, pick in enumerate(picks):
            constraint = CONSTRAINTS[pick][0] if pick < len(CONSTRAINTS) else None
            params = GenerationParams(max_tokens=150, n=n, seed=i, structured_output=constraint)
            ids.append((engine.submit_request(f"prompt {i} " * 4, params), pick))
        records = {r.request_id: r for r in engine.run()}
        for request_id, pick in ids:
            record = records[request_id]
            assert record.error is None, record.error
            if pick < len(CONSTRAINTS):
                for output in record.outputs:
                    CONSTRAINTS[pick][1](output.text)
        assert engine.get_memory_stats().used_blocks == 0
    finally:
        engine.close()


def test_the_same_constraint_with_and_without_preemption_gives_the_same_text() -> None:
    params = GenerationParams(max_tokens=60, seed=7, n=2, structured_output=StructuredOutput.json_schema(SCHEMA))
    texts = []
    for num_blocks in (256, 24):
        engine = grammar_engine(max_num_blocks=num_blocks, executor={"name": "mock", "eos_probability": 0.05})
        others = [engine.submit_request(f"n{i} " * 3, GenerationParams(max_tokens=40, seed=i)) for i in range(4)]
        request_id = engine.submit_request("describe it", params)
        records = {r.request_id: r for r in engine.run()}
        assert all(records[o].error is None for o in others)
        texts.append([o.text for o in records[request_id].outputs])
        if num_blocks == 24:
            assert engine.metrics.num_preemptions > 0
        engine.close()
    assert texts[0] == texts[1]


class FirstTokenSpeculator:
    """Proposes ``token`` (set once the engine is built) and one more after every sequence's tokens."""

    token = 0

    @hookimpl
    def register_speculators(self, register) -> None:
        register("first-token", lambda config, model_info, components: self)

    def propose(self, requests) -> list[list[int]]:
        return [[self.token, self.token][: request.max_proposals] for request in requests]

    def observe(self, seq_id: int, num_proposed: int, num_accepted: int) -> None:
        pass

    def free(self, seq_id: int) -> None:
        pass

    def close(self) -> None:
        pass


def test_proposals_a_constraint_forbids_at_once_leave_a_plain_sample() -> None:
    """Every proposal is cut before its first token: each sample is then a plain one, with its one mask row."""
    from hetero_structured_llguidance import plugin as llguidance

    speculator = FirstTokenSpeculator()
    with_proposals = engine_with(
        (llguidance, "structured-llguidance"), (speculator, "first-token"), speculator="first-token"
    )
    speculator.token = with_proposals.tokenizer.encode("#")[0]  # no choice starts with it
    plain = grammar_engine()
    params = GenerationParams(max_tokens=20, temperature=0.0, structured_output=StructuredOutput.choice(CHOICES))
    try:
        (got,) = with_proposals.generate(["pick a colour"], params)
        (expected,) = plain.generate(["pick a colour"], params)
        assert got.outputs[0].finish_reason is FinishReason.STOP
        assert got.outputs[0].token_ids == expected.outputs[0].token_ids
        assert with_proposals.metrics.speculative_proposed_tokens == 0  # every proposal cut
    finally:
        with_proposals.close()
        plain.close()


def test_a_constraint_that_does_not_compile_is_rejected_at_submission(engine) -> None:
    for constraint in (StructuredOutput.regex("a("), StructuredOutput.json_schema({"type": "nope"})):
        with pytest.raises(ValidationError) as info:
            engine.submit_request("x", GenerationParams(structured_output=constraint))
        assert info.value.param == "structured_output"
    assert not engine.has_pending_work()


def test_a_grammar_in_a_dialect_the_backend_does_not_read_is_refused_by_name(engine) -> None:
    with pytest.raises(
        ValidationError,
        match="backend 'llguidance' does not read grammars in the 'ebnf' dialect .it reads: 'lark', 'gbnf'",
    ) as info:
        engine.submit_request(
            "x", GenerationParams(structured_output=StructuredOutput.grammar('root ::= "x"', dialect="ebnf"))
        )
    assert info.value.param == "structured_output"
    assert not engine.has_pending_work()


def test_logit_bias_ids_beyond_the_vocabulary_are_rejected(engine) -> None:
    with pytest.raises(ValidationError, match="logit_bias token ids must be below the vocabulary size 259, got 300"):
        engine.submit_request("x", GenerationParams(logit_bias={300: 5}))


def test_logit_bias_bans_a_token(engine) -> None:
    greedy = GenerationParams(temperature=0.0, max_tokens=1)
    (first,) = engine.generate(["ban me"], greedy)
    token = first.generated_tokens[0]
    (again,) = engine.generate(["ban me"], GenerationParams(temperature=0.0, max_tokens=1, logit_bias={token: -100}))
    assert again.generated_tokens[0] != token


def test_without_a_structured_output_backend_a_constraint_is_a_config_error() -> None:
    engine = engine_with()
    try:
        engine.generate(["plain requests still work"], GenerationParams(max_tokens=4))
        with pytest.raises(ConfigError, match="unknown structured_output 'llguidance'"):
            engine.submit_request("x", GenerationParams(structured_output=StructuredOutput.json_object()))
    finally:
        engine.close()


def test_an_executor_that_ignores_the_mask_fails_that_request_alone() -> None:
    class Unconstrained:
        @hookimpl
        def register_executors(self, register) -> None:
            class IgnoresMasks(MockExecutor):
                def execute(self, batch):
                    for seq in batch.sequences:
                        seq.allowed_tokens = None
                    return super().execute(batch)

            register("ignores-masks", lambda config, **options: IgnoresMasks(**options))

    from hetero_structured_llguidance import plugin as llguidance

    engine = engine_with(
        (Unconstrained(), "unconstrained"), (llguidance, "structured-llguidance"), executor="ignores-masks"
    )
    try:
        bad = engine.submit_request(
            "x", GenerationParams(max_tokens=20, structured_output=StructuredOutput.choice(["yes"]))
        )
        good = engine.submit_request("y", GenerationParams(max_tokens=20))
        records = {r.request_id: r for r in engine.run()}
        assert "which the request's structured output does not allow" in records[bad].error
        assert records[good].error is None and len(records[good].generated_tokens) == 20
        assert engine.get_memory_stats().used_blocks == 0
    finally:
        engine.close()


class FaultyGrammars:
    """A structured-output plugin whose grammar engine fails: compiling ``"boom"``, or every matcher."""

    @hookimpl
    def register_structured_output_backends(self, register) -> None:
        class Matcher:
            def fill_bitmask(self, bitmask, index):
                raise RuntimeError("matcher broke")

        class Backend:
            def compile(self, constraint):
                if constraint.value == "boom":
                    raise RuntimeError("compiler broke")
                return constraint

            def new_matcher(self, grammar):
                return Matcher()

        register("faulty", lambda tokenizer, **options: Backend())


def test_a_faulty_grammar_engine_is_named_and_harms_no_other_request() -> None:
    engine = engine_with((FaultyGrammars(), "faulty-grammars"), structured_output="faulty")
    try:
        with pytest.raises(ExecutionError, match="structured-output plugin 'faulty-grammars' failed to compile"):
            engine.submit_request("x", GenerationParams(structured_output=StructuredOutput.regex("boom")))
        bad = engine.submit_request("x", GenerationParams(max_tokens=8, structured_output=StructuredOutput.regex("a+")))
        good = engine.submit_request("y", GenerationParams(max_tokens=8))
        records = {r.request_id: r for r in engine.run()}
        assert "structured-output plugin 'faulty-grammars' could not compute the allowed tokens" in records[bad].error
        assert records[good].error is None and len(records[good].generated_tokens) == 8
        assert engine.get_memory_stats().used_blocks == 0
    finally:
        engine.close()


class BatchedGrammars:
    """A grammar engine that fills a step's masks in one call (every token allowed) and records each call's size.

    A matcher of the regex ``"bad"`` fails from its third mask on; with ``batch_raises`` the batch call itself raises.
    """

    def __init__(self, *, batch_raises: bool = False) -> None:
        self.batch_sizes: list[int] = []
        self.num_single_fills = 0
        self.batch_raises = batch_raises

    @hookimpl
    def register_structured_output_backends(self, register) -> None:
        engine = self

        class Matcher:
            is_finished = False

            def __init__(self, is_bad: bool) -> None:
                self.is_bad, self.num_masks = is_bad, 0

            def problem(self) -> str | None:
                self.num_masks += 1
                return "matcher broke at its third mask" if self.is_bad and self.num_masks >= 3 else None

            def fill_bitmask(self, bitmask, row) -> None:
                engine.num_single_fills += 1
                bitmask[row] = -1
                if self.problem() is not None:
                    raise RuntimeError("matcher broke at its third mask")

            def accept_token(self, token_id) -> bool:
                return True

        class Backend:
            def compile(self, constraint):
                return constraint

            def new_matcher(self, grammar):
                return Matcher(grammar.value == "bad")

            def fill_bitmasks(self, matchers, bitmask):
                engine.batch_sizes.append(len(matchers))
                if engine.batch_raises:
                    raise RuntimeError("batch broke")
                bitmask[:] = -1
                return [matcher.problem() for matcher in matchers]

        register("batched", lambda tokenizer, **options: Backend())


def run_batched(grammars: BatchedGrammars) -> tuple[dict, list[str], str, str]:
    """Three good constrained requests, one whose matcher fails, one unconstrained; all in every step's batch."""
    engine = engine_with((grammars, "batched-grammars"), structured_output="batched")
    try:

        def params(pattern: str | None) -> GenerationParams:
            constraint = None if pattern is None else StructuredOutput.regex(pattern)
            return GenerationParams(max_tokens=8, ignore_eos=True, structured_output=constraint)

        good = [engine.submit_request(f"p{i}", params("a+")) for i in range(3)]
        bad = engine.submit_request("q", params("bad"))
        free = engine.submit_request("r", params(None))
        records = {r.request_id: r for r in engine.run()}
        assert engine.get_memory_stats().used_blocks == 0
        return records, good, bad, free
    finally:
        engine.close()


def test_a_step_fills_its_masks_in_one_call_and_a_failing_matcher_fails_alone() -> None:
    grammars = BatchedGrammars()
    records, good, bad, free = run_batched(grammars)
    assert "structured-output plugin 'batched-grammars' could not compute the allowed tokens" in records[bad].error
    for request_id in [*good, free]:
        assert records[request_id].error is None and len(records[request_id].generated_tokens) == 8
    assert (
        grammars.batch_sizes == [4, 4, 4] + [3] * 5
    )  # one call a step for every constrained sample; then without the failed one
    assert grammars.num_single_fills == 0


def test_when_the_batch_call_raises_each_matcher_is_asked_alone() -> None:
    grammars = BatchedGrammars(batch_raises=True)
    records, good, bad, free = run_batched(grammars)
    assert "could not compute the allowed tokens" in records[bad].error
    for request_id in [*good, free]:
        assert records[request_id].error is None and len(records[request_id].generated_tokens) == 8
    assert grammars.batch_sizes == [4, 4, 4] + [3] * 5 and grammars.num_single_fills == 4 * 3 + 3 * 5
