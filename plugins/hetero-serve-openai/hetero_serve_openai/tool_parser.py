"""Reading ``<tool_call>`` blocks out of generated text, as it streams.

Text outside the blocks is content. A block holds ``{"name": ...,
"arguments": {...}}`` (the convention of :mod:`hetero_core.tool_prompt`);
whitespace right after a block is dropped. Feed the text in pieces with
:meth:`ToolCallParser.feed` and end with :meth:`ToolCallParser.finish`;
both return what can be told so far:

- content pieces (``str``), never including any part of a tag;
- :class:`CallDelta` pieces: the first of each call carries its ``id`` and
  ``name``, later ones more ``arguments`` text (OpenAI's stream shape).

With ``incremental`` (forced calls, whose shape the grammar guarantees)
arguments stream as they are generated. Otherwise (``auto``) a block is
held until it closes, then told as one call if it parses and names a known
function, or else as plain content: a malformed call is never an error.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Union

import attrs

from hetero_core.tool_prompt import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_-]{1,64})"\s*,\s*"arguments"\s*:\s*')


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@attrs.define
class CallDelta:
    """Part of call number ``index``: its opening (``id`` and ``name`` set) or more of its arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


Piece = Union[str, CallDelta]


def _held_prefix(text: str, tag: str) -> int:
    """Where the longest end of ``text`` that could begin ``tag`` starts (``len(text)`` when none)."""
    for start in range(max(0, len(text) - len(tag) + 1), len(text)):
        if tag.startswith(text[start:]):
            return start
    return len(text)


class ToolCallParser:
    def __init__(self, names: frozenset[str], *, incremental: bool) -> None:
        self.names = names
        self.incremental = incremental
        self.num_calls = 0
        self.is_cut = False  # the text ended inside a block
        self._pending = ""  # text not yet told
        self._in_call = False
        self._after_call = False  # drop whitespace that follows a block
        self._head_end: int | None = None  # incremental: where the arguments start in _pending
        self._sent = 0  # incremental: arguments characters told

    def feed(self, text: str) -> list[Piece]:
        self._pending += text
        pieces: list[Piece] = []
        while True:
            step = self._inside(pieces) if self._in_call else self._outside(pieces)
            if not step:
                return pieces

    def finish(self) -> list[Piece]:
        """Tell whatever is left: an unclosed block is content, or (incremental) the rest of its arguments."""
        pieces = self.feed("")
        self.is_cut = self._in_call
        if self._in_call and self.incremental and self._head_end is not None:
            self._arguments(pieces, self._pending[self._head_end :])
        elif self._in_call:
            pieces.append(TOOL_CALL_OPEN + self._pending)
        elif self._pending:
            pieces.append(self._pending)
        self._pending, self._in_call = "", False
        return pieces

    def _outside(self, pieces: list[Piece]) -> bool:
        if self._after_call:
            stripped = self._pending.lstrip()
            if not stripped:
                self._pending = ""
                return False
            self._pending, self._after_call = stripped, False
        start = self._pending.find(TOOL_CALL_OPEN)
        cut = start if start >= 0 else _held_prefix(self._pending, TOOL_CALL_OPEN)
        if cut:
            pieces.append(self._pending[:cut])
        if start < 0:
            self._pending = self._pending[cut:]
            return False
        self._pending = self._pending[start + len(TOOL_CALL_OPEN) :]
        self._in_call, self._head_end, self._sent = True, None, 0
        return True

    def _inside(self, pieces: list[Piece]) -> bool:
        end = self._pending.find(TOOL_CALL_CLOSE)
        if self.incremental:
            self._stream_arguments(pieces, end)
        if end < 0:
            return False
        body, self._pending = self._pending[:end], self._pending[end + len(TOOL_CALL_CLOSE) :]
        is_call = self._head_end is not None if self.incremental else self._whole_call(pieces, body)
        if not is_call:
            pieces.append(TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE)
        self._in_call, self._after_call = False, is_call
        return True

    def _stream_arguments(self, pieces: list[Piece], end: int) -> None:
        if self._head_end is None:
            head = HEAD.match(self._pending)
            if head is None or head.group(1) not in self.names:
                return
            self._head_end = head.end()
            pieces.append(CallDelta(self.num_calls, id=new_call_id(), name=head.group(1)))
            self.num_calls += 1
        if self._sent == 0:  # the arguments start at their first non-space
            rest = self._pending[self._head_end :]
            self._head_end += len(rest) - len(rest.lstrip())
        if end >= 0:  # the arguments are all but the object's closing brace
            self._arguments(pieces, self._pending[self._head_end : end].rstrip().removesuffix("}"))
        else:  # hold back from the last brace: it may be the object's own
            available = self._pending[self._head_end :]
            brace = available.rfind("}")
            self._arguments(pieces, available if brace < 0 else available[:brace])

    def _arguments(self, pieces: list[Piece], arguments: str) -> None:
        if len(arguments) > self._sent:
            pieces.append(CallDelta(self.num_calls - 1, arguments=arguments[self._sent :]))
            self._sent = len(arguments)

    def _whole_call(self, pieces: list[Piece], body: str) -> bool:
        try:
            call = json.loads(body)
        except ValueError:
            return False
        arguments = call.get("arguments") if isinstance(call, dict) else None
        if isinstance(arguments, str):  # some models write the arguments as JSON text
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return False
        if not isinstance(arguments, dict) or call.get("name") not in self.names:
            return False
        text = json.dumps(arguments, ensure_ascii=False)
        pieces.append(CallDelta(self.num_calls, arguments=text, id=new_call_id(), name=call["name"]))
        self.num_calls += 1
        return True


def parse_tool_calls(text: str, names: frozenset[str], *, incremental: bool) -> tuple[str, list[CallDelta], bool]:
    """The whole text at once: its content, its calls (each one :class:`CallDelta` with everything),
    and whether it was cut inside a block."""
    parser = ToolCallParser(names, incremental=incremental)
    content, calls = [], []
    for piece in parser.feed(text) + parser.finish():
        if isinstance(piece, str):
            content.append(piece)
        elif piece.id is not None:
            calls.append(piece)
        else:
            calls[piece.index].arguments += piece.arguments
    return "".join(content), calls, parser.is_cut
