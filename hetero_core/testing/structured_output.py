"""Contract tests for structured-output backends.

Subclass :class:`StructuredOutputBackendContract` and override the
``tokenizer`` and ``backend`` fixtures; pytest then runs every check below.
The checks walk each grammar with random tokens drawn from the allowed set,
as a sampler would, and check the decoded text against the constraint. Both
fixtures are class-scoped (or wider): each is a ``classmethod`` under
``@pytest.fixture``, as pytest requires of class-scoped fixtures::

    class TestMyBackend(StructuredOutputBackendContract):
        @pytest.fixture(scope="class")
        @classmethod
        def tokenizer(cls):
            return SimpleTokenizer()

        @pytest.fixture(scope="class")
        @classmethod
        def backend(cls, tokenizer):
            return MyBackend(tokenizer)
"""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from hetero_core.errors import ValidationError
from hetero_core.protocols import Tokenizer
from hetero_core.structured_output import (
    BatchMaskFiller,
    GrammarMatcher,
    StructuredOutput,
    StructuredOutputBackend,
    allowed_token_ids,
    new_bitmask,
)

MAX_WALK = 400
CLOSERS = frozenset({'"', "}", "]", '"}', "}}", "]}", '"]', "0", "1", ",", " "})
FINITE_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "digit": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "digit"],
    "additionalProperties": False,
}


class Walker:
    """Random walks through a grammar: EOS as soon as it is allowed, short closing tokens preferred."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.eos = tokenizer.eos_token_id
        self.closers = np.array(
            [t for t in range(self.vocab_size) if tokenizer.decode([t], skip_special_tokens=True) in CLOSERS]
        )

    def allowed_mask(self, matcher: GrammarMatcher) -> np.ndarray:
        """The matcher's bitmask row, filled alone."""
        bitmask = new_bitmask(1, self.vocab_size)
        bitmask[0] = 0
        matcher.fill_bitmask(bitmask, 0)
        return bitmask[0]

    def allowed(self, matcher: GrammarMatcher) -> np.ndarray:
        return allowed_token_ids(self.allowed_mask(matcher), self.vocab_size)

    def walk(self, matcher: GrammarMatcher, rng: random.Random) -> list[int]:
        """The tokens of one complete walk, EOS excluded."""
        tokens: list[int] = []
        for _ in range(MAX_WALK):
            allowed = self.allowed(matcher)
            assert len(allowed), f"the grammar allows no token after {self.tokenizer.decode(tokens)!r}"
            if self.eos in allowed:
                assert matcher.accept_token(self.eos)
                assert matcher.is_finished
                return tokens
            closing = np.intersect1d(allowed, self.closers, assume_unique=True)
            pool = closing if len(closing) and rng.random() < 0.8 else allowed
            token = int(pool[rng.randrange(len(pool))])
            assert matcher.accept_token(token), f"token {token} was allowed but not accepted"
            tokens.append(token)
        raise AssertionError(f"no end of the grammar within {MAX_WALK} tokens: {self.tokenizer.decode(tokens)!r}")

    def text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


class StructuredOutputBackendContract:
    """What every :class:`~hetero_core.structured_output.StructuredOutputBackend` must do."""

    @pytest.fixture(scope="class")
    @classmethod
    def tokenizer(cls) -> Tokenizer:
        raise NotImplementedError("override the `tokenizer` fixture")

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, tokenizer: Tokenizer) -> StructuredOutputBackend:
        raise NotImplementedError("override the `backend` fixture")

    @pytest.fixture(scope="class")
    @classmethod
    def walker(cls, tokenizer: Tokenizer) -> Walker:
        return Walker(tokenizer)

    def matcher(self, backend: StructuredOutputBackend, constraint: StructuredOutput) -> GrammarMatcher:
        return backend.new_matcher(backend.compile(constraint))

    def test_is_a_structured_output_backend(self, backend: StructuredOutputBackend) -> None:
        assert isinstance(backend, StructuredOutputBackend)
        assert isinstance(self.matcher(backend, StructuredOutput.json_object()), GrammarMatcher)

    def test_choice_walks_end_on_a_choice(self, backend: StructuredOutputBackend, walker: Walker) -> None:
        choices = ("yes", "no", "maybe so", "Ünïcode ✓")
        constraint = StructuredOutput.choice(choices)
        rng = random.Random(0)
        seen = {walker.text(walker.walk(self.matcher(backend, constraint), rng)) for _ in range(30)}
        assert seen <= set(choices) and len(seen) >= 2

    def test_regex_walks_match_the_whole_pattern(self, backend: StructuredOutputBackend, walker: Walker) -> None:
        pattern = r"[0-9]{3}-[a-z]{2,4}(!|\?)?"
        rng = random.Random(1)
        for _ in range(20):
            text = walker.text(walker.walk(self.matcher(backend, StructuredOutput.regex(pattern)), rng))
            assert re.fullmatch(pattern, text), text

    def test_json_schema_walks_validate(self, backend: StructuredOutputBackend, walker: Walker) -> None:
        rng = random.Random(2)
        for _ in range(20):
            value = json.loads(walker.text(walker.walk(self.matcher(backend, StructuredOutput.json_schema(FINITE_SCHEMA)), rng)))
            assert set(value) == {"ok", "digit"} and isinstance(value["ok"], bool) and value["digit"] in range(10)

    def test_json_schema_walks_keep_the_order_of_the_properties(self, backend: StructuredOutputBackend, walker: Walker) -> None:
        reordered = {**FINITE_SCHEMA, "properties": dict(reversed(FINITE_SCHEMA["properties"].items()))}
        rng = random.Random(6)
        for schema, order in ((FINITE_SCHEMA, ["ok", "digit"]), (reordered, ["digit", "ok"])):
            for _ in range(5):
                text = walker.text(walker.walk(self.matcher(backend, StructuredOutput.json_schema(schema)), rng))
                assert list(json.loads(text)) == order, text

    def test_json_object_walks_parse_as_objects(self, backend: StructuredOutputBackend, walker: Walker) -> None:
        rng = random.Random(3)
        for _ in range(10):
            text = walker.text(walker.walk(self.matcher(backend, StructuredOutput.json_object()), rng))
            assert isinstance(json.loads(text), dict), text

    def test_invalid_constraints_are_validation_errors(self, backend: StructuredOutputBackend) -> None:
        for constraint in (StructuredOutput.regex("a("), StructuredOutput.json_schema({"type": "no-such-type"})):
            with pytest.raises(ValidationError) as info:
                backend.compile(constraint)
            assert info.value.param == "structured_output"

    def test_compiling_an_equal_constraint_again_returns_the_cached_grammar(self, backend: StructuredOutputBackend) -> None:
        first = backend.compile(StructuredOutput.json_schema(FINITE_SCHEMA))
        assert backend.compile(StructuredOutput.json_schema(json.dumps(FINITE_SCHEMA))) is first

    def test_a_forbidden_token_is_refused_and_changes_nothing(
        self, backend: StructuredOutputBackend, walker: Walker, tokenizer: Tokenizer
    ) -> None:
        matcher = self.matcher(backend, StructuredOutput.choice(["yes", "no"]))
        before = walker.allowed(matcher)
        forbidden = next(t for t in range(tokenizer.vocab_size) if t not in set(before.tolist()))
        assert not matcher.accept_token(forbidden)
        assert np.array_equal(walker.allowed(matcher), before)

    def test_rollback_returns_to_the_earlier_state(self, backend: StructuredOutputBackend, walker: Walker) -> None:
        matcher = self.matcher(backend, StructuredOutput.json_schema(FINITE_SCHEMA))
        rng = random.Random(4)
        states, tokens = [walker.allowed(matcher)], []
        for _ in range(4):
            allowed = states[-1]
            token = int(allowed[rng.randrange(len(allowed))])
            if token == walker.eos:
                break
            assert matcher.accept_token(token)
            tokens.append(token)
            states.append(walker.allowed(matcher))
        for back in range(len(tokens), 0, -1):
            matcher.rollback(1)
            assert np.array_equal(walker.allowed(matcher), states[back - 1])

    def test_forks_are_independent(self, backend: StructuredOutputBackend, walker: Walker) -> None:
        parent = self.matcher(backend, StructuredOutput.choice(["alpha", "beta"]))
        child = parent.fork()
        before = walker.allowed(parent)
        rng = random.Random(5)
        walker.walk(child, rng)
        assert child.is_finished and not parent.is_finished
        assert np.array_equal(walker.allowed(parent), before)

    def test_masks_filled_together_equal_masks_filled_one_by_one(
        self, backend: StructuredOutputBackend, walker: Walker, tokenizer: Tokenizer
    ) -> None:
        """Only for a backend with ``fill_bitmasks``: samples of several grammars, each at its own point of a walk."""
        if not isinstance(backend, BatchMaskFiller):
            pytest.skip("the backend fills masks one matcher at a time")
        rng = random.Random(7)
        constraints = [
            StructuredOutput.json_schema(FINITE_SCHEMA),
            StructuredOutput.regex(r"[0-9]{3}-[a-z]{2,4}"),
            StructuredOutput.json_object(),
        ]
        matchers = [self.matcher(backend, constraints[i % len(constraints)]) for i in range(12)]
        for step in range(6):
            together = new_bitmask(len(matchers), tokenizer.vocab_size)
            together[:] = 0
            assert backend.fill_bitmasks(matchers, together) == [None] * len(matchers)
            for row, matcher in enumerate(matchers):
                assert np.array_equal(together[row], walker.allowed_mask(matcher)), (step, row)
                allowed = [t for t in allowed_token_ids(together[row], tokenizer.vocab_size).tolist() if t != walker.eos]
                if allowed and not matcher.is_finished:
                    assert matcher.accept_token(rng.choice(allowed))
