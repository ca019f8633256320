"""Constraints that compile but cannot go past their first token are refused at compile time, naming why;
large valid ones work."""

from __future__ import annotations

import json
import random
import time

import jsonschema
import pytest

from hetero_core.errors import ValidationError
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.structured_output import StructuredOutput
from hetero_core.testing.structured_output import Walker
from hetero_structured_llguidance import plugin
from hetero_structured_llguidance.limits import GrammarLimits

THOUSAND_STRINGS = {
    "type": "object",
    "properties": {f"field_{i}": {"type": "string", "maxLength": 4} for i in range(1000)},
}
SELF_REFERENCE = {"$ref": "#"}

REFUSED = [
    (
        "a schema that is only a reference to itself",
        StructuredOutput.json_schema(SELF_REFERENCE),
        "no text satisfies the json_schema",
    ),
    (
        "mutually recursive definitions with no base case",
        StructuredOutput.json_schema(
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
        ),
        "no text satisfies the json_schema",
    ),
    (
        "an object that requires itself at every level",
        StructuredOutput.json_schema({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}),
        "the json_schema passes the grammar engine's limit structured_output.step_max_items = 50,000",
    ),
    ("a regex that matches nothing", StructuredOutput.regex("[^\\x00-\\x{10FFFF}]"), "no text satisfies the regex"),
    (
        "a repetition nested three deep",
        StructuredOutput.regex("((a{1000}){1000}){1000}"),
        "the regex cannot be used: lexer error",
    ),
    (
        "forced calls of a function whose arguments refer to themselves",
        StructuredOutput.tool_calls({"f": SELF_REFERENCE}, several=True),
        "no text satisfies the tool_calls",
    ),
]


@pytest.mark.parametrize(("constraint", "message"), [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_a_constraint_that_fails_at_its_first_token_is_refused_at_compile_time(backend, constraint, message) -> None:
    with pytest.raises(ValidationError, match=message) as first:
        backend.compile(constraint)
    assert first.value.param == "structured_output"
    started = time.monotonic()
    with pytest.raises(ValidationError) as again:  # remembered: not compiled a second time
        backend.compile(constraint)
    assert again.value.message == first.value.message and time.monotonic() - started < 0.05


def test_a_thousand_optional_string_properties_work_from_the_first_token(backend, tokenizer) -> None:
    compiled = backend.compile(StructuredOutput.json_schema(THOUSAND_STRINGS))
    walker = Walker(tokenizer)
    first = walker.allowed(backend.new_matcher(compiled))
    assert len(first) > 1
    for token in first:  # whatever the first mask allows is taken, and the next mask follows
        matcher = backend.new_matcher(compiled)
        assert matcher.accept_token(int(token)), tokenizer.decode([int(token)])
        assert len(walker.allowed(matcher))
    opening = tokenizer.encode('{"', add_special_tokens=False)
    assert len(opening) == 1 and opening[0] in first
    rng = random.Random(3)
    for _ in range(4):
        text = walker.text(walker.walk(backend.new_matcher(compiled), rng))
        jsonschema.validate(json.loads(text), THOUSAND_STRINGS)


@pytest.mark.parametrize(
    ("limit", "constraint"),
    [
        ({"max_items_in_row": 2000}, StructuredOutput.json_schema(THOUSAND_STRINGS)),
        ({"max_grammar_size": 1000}, StructuredOutput.json_schema(THOUSAND_STRINGS)),
        ({"compile_fuel": 1000}, StructuredOutput.json_schema(THOUSAND_STRINGS)),
        ({"step_max_items": 1000}, StructuredOutput.json_schema(THOUSAND_STRINGS)),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else "",
)
def test_each_bound_is_an_option_and_its_refusal_names_it(tokenizer, limit, constraint) -> None:
    pm = create_plugin_manager(entry_points=False)
    pm.register(plugin, name="structured-llguidance")
    backend = ComponentRegistry(pm).create("structured_output", "llguidance", limit, tokenizer)
    ((option, value),) = limit.items()
    assert getattr(backend.limits, option) == value
    with pytest.raises(ValidationError, match=f"limit structured_output.{option} = {value:,}: "):
        backend.compile(constraint)


def test_the_default_bounds_are_llguidance_s_but_a_wider_row() -> None:
    limits = GrammarLimits().parser_limits()
    assert (limits.max_grammar_size, limits.initial_lexer_fuel, limits.step_max_items) == (500_000, 1_000_000, 50_000)
    assert limits.max_items_in_row == 10_000  # llguidance's 2,000 stops an object of about 500 optional properties
