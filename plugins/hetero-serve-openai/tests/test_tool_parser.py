"""The ``<tool_call>`` parser (whole texts, any split into stream pieces, malformed calls)
and the forced-call grammar."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from hetero_core.builtin.simple_tokenizer import SimpleTokenizer
from hetero_core.tool_prompt import TOOL_CALL_OPEN, tool_call_block
from hetero_serve_openai.tool_parser import CallDelta, ToolCallParser, parse_tool_calls
from hetero_serve_openai.tools import FunctionDefinition, tool_calls_constraint
from hetero_structured_llguidance import LLGuidanceBackend

NAMES = frozenset({"get_weather", "get_time"})

plain_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30).filter(lambda t: "<tool_call>" not in t)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
calls = st.lists(
    st.tuples(st.sampled_from(sorted(NAMES)), st.dictionaries(st.text(max_size=6), json_values, max_size=3)), max_size=3
)


def stream(text: str, cuts: list[int], *, incremental: bool) -> tuple[str, list[CallDelta]]:
    """Feed ``text`` in pieces split at ``cuts``, then reassemble as a streaming client would."""
    parser = ToolCallParser(NAMES, incremental=incremental)
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    pieces = [p for a, b in itertools.pairwise(bounds) for p in parser.feed(text[a:b])] + parser.finish()
    content, assembled = "", []
    for piece in pieces:
        if isinstance(piece, str):
            content += piece
        elif piece.id is not None:
            assert piece.index == len(assembled) and piece.name in NAMES
            assembled.append(CallDelta(piece.index, piece.arguments, piece.id, piece.name))
        else:
            assembled[piece.index].arguments += piece.arguments
    return content, assembled


@given(plain_text, calls, st.lists(st.integers(min_value=0), max_size=8), st.booleans())
def test_text_and_well_formed_calls_round_trip_however_they_are_split(text, expected, cuts, incremental) -> None:
    if incremental:  # forced calls: nothing but calls, as the grammar writes them
        text = ""
    whole = text + "\n".join(tool_call_block(name, arguments) for name, arguments in expected)
    content, parsed = stream(whole, cuts, incremental=incremental)
    assert content == text
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == expected
    assert len({c.id for c in parsed}) == len(parsed)
    assert all(c.id.startswith("call_") for c in parsed)


@given(st.text(max_size=60), st.lists(st.integers(min_value=0), max_size=6), st.booleans())
def test_any_text_never_raises_and_text_without_calls_is_all_content(text, cuts, incremental) -> None:
    content, parsed = stream(text, cuts, incremental=incremental)
    assert parsed or content == text


@given(st.text(max_size=30), st.lists(st.integers(min_value=0), max_size=6), st.booleans())
def test_a_malformed_block_is_content(body, cuts, incremental) -> None:
    text = f"{TOOL_CALL_OPEN}{body.replace('<', '')}</tool_call> after"
    assert stream(text, cuts, incremental=incremental) == (text, [])


@given(st.text(max_size=40), st.lists(st.integers(min_value=0), max_size=6))
def test_a_tag_never_leaks_into_content_before_a_call(prefix, cuts) -> None:
    prefix = prefix.replace("<", "")
    content, parsed = stream(prefix + tool_call_block("get_time", {"zone": "UTC"}), cuts, incremental=False)
    assert content == prefix and [c.name for c in parsed] == ["get_time"]


def test_malformed_calls_stay_content() -> None:
    for body in (
        "not json",
        '{"name": "nope", "arguments": {}}',
        '{"name": "get_time"}',
        '{"name": "get_time", "arguments": 3}',
    ):
        text = f"Sure. {TOOL_CALL_OPEN}{body}</tool_call>"
        assert parse_tool_calls(text, NAMES, incremental=False) == (text, [], False)


def test_arguments_given_as_json_text_are_read() -> None:
    text = '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}</tool_call>'
    content, (call,), _ = parse_tool_calls(text, NAMES, incremental=False)
    assert content == "" and json.loads(call.arguments) == {"zone": "UTC"}


def test_an_unclosed_call_is_content_or_partial_arguments() -> None:
    text = 'Hi <tool_call>\n{"name": "get_time", "arguments": {"zone": "U'
    assert parse_tool_calls(text, NAMES, incremental=False) == (text, [], True)
    content, (call,), is_cut = parse_tool_calls(text[3:], NAMES, incremental=True)
    assert content == "" and call.name == "get_time" and call.arguments == '{"zone": "U' and is_cut


def test_forced_arguments_stream_before_the_call_closes() -> None:
    parser = ToolCallParser(NAMES, incremental=True)
    (opening,) = parser.feed('<tool_call>\n{"name": "get_time", "arguments": ')
    assert opening.name == "get_time" and opening.arguments == ""
    assert parser.feed('{"zone": "Europe/Paris"') == [CallDelta(0, '{"zone": "Europe/Paris"')]
    assert parser.feed("}") == []  # held: it may close the call
    assert parser.feed("}\n</tool_call>") == [CallDelta(0, "}")]


def test_the_forced_call_grammar_admits_only_declared_parameters() -> None:
    backend = LLGuidanceBackend(SimpleTokenizer())
    schema = {"type": "object", "properties": {"zone": {"type": "object", "properties": {"name": {"type": "string"}}}}}
    strict = FunctionDefinition(name="get_time", parameters=schema, strict=True)
    plain = FunctionDefinition(name="get_time", parameters=schema)
    free = FunctionDefinition(name="get_time", parameters={"type": "object"}, strict=True)

    def accepts(function: FunctionDefinition, arguments: dict) -> bool:
        matcher = backend.new_matcher(backend.compile(tool_calls_constraint([function], several=False)))
        return all(
            matcher.accept_token(t)
            for t in SimpleTokenizer().encode(tool_call_block("get_time", arguments), add_special_tokens=False)
        )

    for function in (strict, plain):  # the top level holds the declared parameters
        assert accepts(function, {"zone": {"name": "UTC"}}) and not accepts(
            function, {"zone": {"name": "UTC"}, "extra": 1}
        )
    assert not accepts(strict, {"zone": {"name": "UTC", "extra": 1}})  # strict: nested objects too
    assert accepts(plain, {"zone": {"name": "UTC", "extra": 1}})  # otherwise JSON Schema as written
    assert accepts(free, {"anything": [1, 2]})


def test_under_auto_the_text_is_free_and_each_call_a_strict_function_opens_is_constrained() -> None:
    tokenizer = SimpleTokenizer()
    backend = LLGuidanceBackend(tokenizer)
    strict = FunctionDefinition(
        name="get_time", parameters={"type": "object", "properties": {"zone": {"type": "string"}}}, strict=True
    )
    call = tool_call_block("get_time", {"zone": "UTC"})

    def accepts(text: str, *, several: bool = True) -> bool:
        matcher = backend.new_matcher(backend.compile(tool_calls_constraint([strict], several=several, free_text=True)))
        taken = all(matcher.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))
        return taken and matcher.accept_token(tokenizer.eos_token_id)  # and the text may end there

    assert accepts("Just text: a < b, <tool_ and </tool_call> are text too.")
    assert accepts(f"Let me look.\n{call}\nDone.") and accepts(f"{call}\n{call}")
    assert not accepts(f"{call}\n{call}", several=False)  # parallel_tool_calls false: one call
    assert not accepts(tool_call_block("get_time", {"zone": "UTC", "extra": 1}))
    assert not accepts(tool_call_block("get_date", {}))
    assert not accepts(f"{TOOL_CALL_OPEN}\nnot a call")
