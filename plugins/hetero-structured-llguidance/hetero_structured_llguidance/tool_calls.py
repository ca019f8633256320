"""A ``TOOL_CALLS`` constraint as a Lark grammar in llguidance's dialect
(``%json`` rules hold the arguments' schemas)."""

from __future__ import annotations

import json

from hetero_core.structured_output import ToolCalls

#: Arguments are written as ``json.dumps`` writes them, whatever ``whitespace_flexible`` says:
#: a call's text is fixed up to its values, so a small model never wanders into blank lines.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def tool_calls_grammar(calls: ToolCalls) -> str:
    """The Lark grammar of ``calls``: the calls alone, or free text around them (see :class:`ToolCalls`)."""
    open_tag = json.dumps(calls.open_tag)
    if calls.free_text:
        # The text between calls holds no opening tag; the tag ends it, so the lexer never guesses where a call begins.
        no_open_tag = f"/(?s:.*)/ & ~/(?s:.*){_regex_literal(calls.open_tag)}(?s:.*)/"
        start = "start: (TEXT_THEN_OPEN call)* TEXT" if calls.several else "start: (TEXT_THEN_OPEN call)? TEXT"
        head = [start, f"TEXT: {no_open_tag}", f"TEXT_THEN_OPEN: TEXT {open_tag}"]
    else:
        head = [f'start: {open_tag} call ("\\n" {open_tag} call)*' if calls.several else f"start: {open_tag} call"]
    return "\n".join([*head, *_call_rules(calls)])


def _regex_literal(text: str) -> str:
    """A regular expression matching ``text`` alone; every character but letters, digits and ``_`` as a
    ``\\x{...}`` escape, so no tag can end the Lark regex (``/``) or its line."""
    plain = {*"_0123456789", *map(chr, range(ord("a"), ord("z") + 1)), *map(chr, range(ord("A"), ord("Z") + 1))}
    return "".join(char if char in plain else f"\\x{{{ord(char):x}}}" for char in text)


def _call_rules(calls: ToolCalls) -> list[str]:
    """``call``: what follows the opening tag, for any of the functions."""
    rules = ["call: " + " | ".join(f"call_{number}" for number in range(len(calls.functions)))]
    tail = json.dumps("}\n" + calls.close_tag)
    for number, function in enumerate(calls.functions):
        schema = {**function.schema, "x-guidance": COMPACT_JSON}
        head = json.dumps(f'\n{{"name": {json.dumps(function.name)}, "arguments": ')
        rules.append(f"call_{number}: {head} args_{number} {tail}")
        rules.append(f"args_{number}: %json {json.dumps(schema)}")
    return rules
