"""Contract tests for structured-output backends.

Subclass :class:`StructuredOutputBackendContract` and override the
``tokenizer`` and ``backend`` fixtures; pytest then runs every check below.
The checks walk each grammar with random tokens drawn from the allowed set,
as a sampler would, and check the decoded text against the constraint: every
constraint kind (grammars in each dialect the kit knows and the backend
declares, tool calls forced, several and in free text), control tokens kept
out of the text at every step, a complete grammar allowing end-of-sequence
alone, and rollback (across an accepted end-of-sequence too). Both
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
from hetero_core.tool_prompt import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

MAX_WALK = 400
CLOSERS = frozenset({'"', "}", "]", '"}', "}}", "]}", '"]', "0", "1", ",", " ", ">", "!"})
FINITE_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "digit": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "digit"],
    "additionalProperties": False,
}
#: One language in each dialect the kit knows: ``GREETING`` in full.
GRAMMARS = {
    "lark": 'start: greeting " " name "!"\ngreeting: "hello" | "hi"\nname: /[a-z]{2,4}/',
    "gbnf": 'root ::= greeting " " name "!"\ngreeting ::= "hello" | "hi"\nname ::= [a-z] [a-z] [a-z]? [a-z]?',
}
GREETING = r"(hello|hi) [a-z]{2,4}!"
#: The functions of the tool-call checks: one with arguments, one without.
TOOL_FUNCTIONS = {"set_flag": FINITE_SCHEMA, "ping": None}


class Walker:
    """Random walks through a grammar: EOS as soon as it is allowed, short closing tokens preferred.

    At every step it checks that no control token but EOS is allowed.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.eos = tokenizer.eos_token_id
        self.controls = np.array(sorted(tokenizer.special_token_ids - {self.eos}), dtype=np.int64)
        specials = tokenizer.special_token_ids
        self.closers = np.array(
            [
                t
                for t in range(self.vocab_size)
                if t not in specials and tokenizer.decode([t], skip_special_tokens=True) in CLOSERS
            ]
        )

    def allowed_mask(self, matcher: GrammarMatcher) -> np.ndarray:
        """The matcher's bitmask row, filled alone."""
        bitmask = new_bitmask(1, self.vocab_size)
        bitmask[0] = 0
        matcher.fill_bitmask(bitmask, 0)
        return bitmask[0]

    def allowed(self, matcher: GrammarMatcher) -> np.ndarray:
        allowed = allowed_token_ids(self.allowed_mask(matcher), self.vocab_size)
        controls = np.intersect1d(allowed, self.controls)
        assert not len(controls), f"control tokens {controls.tolist()} are allowed inside constrained text"
        return allowed

    def accept_text(self, matcher: GrammarMatcher, text: str) -> list[int]:
        """Feed the tokens of ``text``, checking each was allowed and is accepted."""
        tokens = self.tokenizer.encode(text, add_special_tokens=False)
        for token in tokens:
            assert token in self.allowed(matcher), f"token {token} of {text!r} is not allowed"
            assert matcher.accept_token(token), f"token {token} of {text!r} was allowed but not accepted"
        return tokens

    def walk(self, matcher: GrammarMatcher, rng: random.Random, *, take_eos: bool = True) -> list[int]:
        """The tokens of one complete walk, EOS excluded; without ``take_eos`` it stops where EOS is first allowed."""
        tokens: list[int] = []
        for _ in range(MAX_WALK):
            allowed = self.allowed(matcher)
            assert len(allowed), f"the grammar allows no token after {self.tokenizer.decode(tokens)!r}"
            if self.eos in allowed:
                if take_eos:
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
            value = json.loads(
                walker.text(walker.walk(self.matcher(backend, StructuredOutput.json_schema(FINITE_SCHEMA)), rng))
            )
            assert set(value) == {"ok", "digit"} and isinstance(value["ok"], bool) and value["digit"] in range(10)

    def test_json_schema_walks_keep_the_order_of_the_properties(
        self, backend: StructuredOutputBackend, walker: Walker
    ) -> None:
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

    def test_compiling_an_equal_constraint_again_returns_the_cached_grammar(
        self, backend: StructuredOutputBackend
    ) -> None:
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

    def test_rollback_crosses_the_end(self, backend: StructuredOutputBackend, walker: Walker) -> None:
        matcher = self.matcher(backend, StructuredOutput.choice(["alpha", "beta"]))
        start = walker.allowed(matcher)
        tokens = walker.walk(matcher, random.Random(5))
        matcher.rollback(0)
        assert matcher.is_finished
        matcher.rollback(len(tokens) + 1)  # the text and its EOS
        assert not matcher.is_finished and np.array_equal(walker.allowed(matcher), start)
        assert walker.text(walker.walk(matcher, random.Random(6))) in ("alpha", "beta")

    @pytest.mark.parametrize(
        "constraint",
        [
            StructuredOutput.choice(["red", "green", "blue"]),
            StructuredOutput.json_schema(FINITE_SCHEMA),
            StructuredOutput.json_object(),
            StructuredOutput.tool_calls(TOOL_FUNCTIONS),
        ],
        ids=["choice", "json_schema", "json_object", "tool_call"],
    )
    def test_a_complete_text_allows_only_the_end(
        self, backend: StructuredOutputBackend, walker: Walker, constraint: StructuredOutput
    ) -> None:
        """Nothing may follow a complete value: no trailing whitespace, no second value, just EOS."""
        rng = random.Random(8)
        for _ in range(5):
            matcher = self.matcher(backend, constraint)
            tokens = walker.walk(matcher, rng, take_eos=False)
            assert walker.allowed(matcher).tolist() == [walker.eos], walker.text(tokens)
            assert matcher.is_finished

    def test_control_tokens_stay_out_of_free_text(
        self, backend: StructuredOutputBackend, walker: Walker, tokenizer: Tokenizer
    ) -> None:
        """Inside a JSON string and in tool calls' free text, where any text may go, no control token may."""
        matcher = self.matcher(backend, StructuredOutput.json_schema({"type": "string"}))
        walker.accept_text(matcher, '"')
        assert walker.eos not in walker.allowed(matcher)  # the string is open
        free = self.matcher(backend, StructuredOutput.tool_calls(TOOL_FUNCTIONS, free_text=True))
        assert walker.eos in walker.allowed(free)  # the model may answer without a call
        walker.accept_text(free, "Let me see.")
        assert walker.eos in walker.allowed(free)

    def test_grammar_dialects_are_declared(self, backend: StructuredOutputBackend) -> None:
        dialects = backend.grammar_dialects
        assert isinstance(dialects, tuple) and all(isinstance(d, str) and d for d in dialects)
        with pytest.raises(ValidationError, match="no-such-dialect") as info:
            backend.compile(StructuredOutput.grammar('start: "x"', dialect="no-such-dialect"))
        assert info.value.param == "structured_output"

    @pytest.mark.parametrize("dialect", sorted(GRAMMARS))
    def test_grammar_walks_match_the_language(
        self, backend: StructuredOutputBackend, walker: Walker, dialect: str
    ) -> None:
        if dialect not in backend.grammar_dialects:
            pytest.skip(f"the backend does not read {dialect}")
        constraint = StructuredOutput.grammar(GRAMMARS[dialect], dialect=dialect)
        rng = random.Random(9)
        seen = set()
        for _ in range(10):
            text = walker.text(walker.walk(self.matcher(backend, constraint), rng))
            assert re.fullmatch(GREETING, text), text
            seen.add(text)
        assert len(seen) >= 2
        with pytest.raises(ValidationError):
            backend.compile(
                StructuredOutput.grammar(GRAMMARS[dialect].replace('"!"', '"!" missing_rule'), dialect=dialect)
            )

    def check_calls(self, text: str, *, open_tag: str = TOOL_CALL_OPEN, close_tag: str = TOOL_CALL_CLOSE) -> list[dict]:
        """The calls of ``text`` (calls alone, one a line), each checked against :data:`TOOL_FUNCTIONS`."""
        calls = []
        for block in text.split("\n" + open_tag):
            assert block.startswith(open_tag) or calls, text
            body = block.removeprefix(open_tag)
            assert body.startswith("\n") and body.endswith("\n" + close_tag), text
            call = json.loads(body[1 : -len(close_tag) - 1])
            assert json.dumps(call, ensure_ascii=False) == body[1 : -len(close_tag) - 1], (
                f"not written as json.dumps writes it: {text!r}"
            )
            assert list(call) == ["name", "arguments"] and call["name"] in TOOL_FUNCTIONS, text
            arguments = call["arguments"]
            if call["name"] == "ping":
                assert arguments == {}, text
            else:
                assert (
                    set(arguments) == {"ok", "digit"}
                    and isinstance(arguments["ok"], bool)
                    and arguments["digit"] in range(10)
                ), text
            calls.append(call)
        return calls

    def test_a_forced_call_names_a_function_with_valid_arguments(
        self, backend: StructuredOutputBackend, walker: Walker
    ) -> None:
        constraint = StructuredOutput.tool_calls(TOOL_FUNCTIONS)
        rng = random.Random(10)
        names = set()
        for _ in range(12):
            (call,) = self.check_calls(walker.text(walker.walk(self.matcher(backend, constraint), rng)))
            names.add(call["name"])
        assert names == set(TOOL_FUNCTIONS)

    def test_calls_in_the_tags_the_constraint_names(self, backend: StructuredOutputBackend, walker: Walker) -> None:
        tags = {"open_tag": "[CALL]", "close_tag": "[/CALL]"}
        constraint = StructuredOutput.tool_calls(TOOL_FUNCTIONS, **tags)
        text = walker.text(walker.walk(self.matcher(backend, constraint), random.Random(11)))
        self.check_calls(text, **tags)

    def test_several_calls_follow_one_another_on_new_lines(
        self, backend: StructuredOutputBackend, walker: Walker
    ) -> None:
        matcher = self.matcher(backend, StructuredOutput.tool_calls(TOOL_FUNCTIONS, several=True))
        rng = random.Random(12)
        first = walker.walk(matcher, rng, take_eos=False)
        assert len(walker.allowed(matcher)) > 1 and not matcher.is_finished  # the end, or another call
        more = walker.accept_text(matcher, "\n" + TOOL_CALL_OPEN)
        rest = walker.walk(matcher, rng)
        assert len(self.check_calls(walker.text(first + more + rest))) == 2

    @pytest.mark.parametrize(
        "open_tag, close_tag",
        [(TOOL_CALL_OPEN, TOOL_CALL_CLOSE), ("<call/>", "</call>"), ("[[x.*]]\n", "[[/x]]")],  # a grammar's delimiters
    )
    def test_a_call_opened_in_free_text_is_constrained(
        self, backend: StructuredOutputBackend, walker: Walker, open_tag: str, close_tag: str
    ) -> None:
        constraint = StructuredOutput.tool_calls(TOOL_FUNCTIONS, free_text=True, open_tag=open_tag, close_tag=close_tag)
        matcher = self.matcher(backend, constraint)
        rng = random.Random(13)
        prefix = walker.accept_text(matcher, "I will call it.\n" + open_tag)
        assert walker.eos not in walker.allowed(matcher)
        call = walker.walk(matcher, rng)
        text = walker.text(prefix + call)
        assert text.startswith("I will call it.\n")
        end = text.index(close_tag) + len(close_tag)  # free text again after it, maybe in the same token
        self.check_calls(text[len("I will call it.\n") : end], open_tag=open_tag, close_tag=close_tag)
        assert open_tag not in text[end:]

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
                allowed = [
                    t for t in allowed_token_ids(together[row], tokenizer.vocab_size).tolist() if t != walker.eos
                ]
                if allowed and not matcher.is_finished:
                    assert matcher.accept_token(rng.choice(allowed))
