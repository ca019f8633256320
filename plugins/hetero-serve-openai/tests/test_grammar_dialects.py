"""A request's grammar is GBNF when a line defines a rule with ``::=``, else Lark; both compile on llguidance."""

from __future__ import annotations

import pytest

from hetero_core.builtin.simple_tokenizer import SimpleTokenizer
from hetero_core.structured_output import Grammar
from hetero_serve_openai.constraints import constraint_of
from hetero_structured_llguidance import LLGuidanceBackend

GRAMMARS = [
    ('start: "yes" | "no"', "lark"),
    ('root ::= "yes" | "no"', "gbnf"),
    ('# answers\nroot ::= answer\nanswer ::= "yes" | "no"', "gbnf"),
    ('start: answer\nanswer: "yes" | "no"  // not ::= GBNF', "lark"),
]


@pytest.mark.parametrize(("text", "dialect"), GRAMMARS)
def test_a_grammar_names_its_dialect_and_compiles(text, dialect) -> None:
    constraint = constraint_of("grammar", text)
    assert constraint.value == Grammar(dialect, text)
    tokenizer = SimpleTokenizer()
    backend = LLGuidanceBackend(tokenizer)
    matcher = backend.new_matcher(backend.compile(constraint))
    assert all(matcher.accept_token(token) for token in tokenizer.encode("no", add_special_tokens=False))
    assert matcher.is_finished
