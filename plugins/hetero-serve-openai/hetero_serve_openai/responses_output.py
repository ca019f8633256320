"""A response's output items, and the stream events that build them, from the generated text.

:class:`OutputItems` reads the text as it arrives (through the chat route's
:class:`~hetero_serve_openai.tool_parser.ToolCallParser` when tools are in
use): text becomes a ``message`` item with one ``output_text`` part,
each call a ``function_call`` item. Each step returns the events OpenAI
streams for it (without ``sequence_number``, which the stream adds):

- text begins: ``response.output_item.added`` (a message), ``response.content_part.added``;
- more text: ``response.output_text.delta``;
- a call begins: ``response.output_item.added`` (a function_call, its arguments empty);
- more arguments: ``response.function_call_arguments.delta``;
- an item ends (the next begins, or the text ends): ``response.output_text.done``
  and ``response.content_part.done`` for text, ``response.function_call_arguments.done``
  for a call, then ``response.output_item.done``.

A response without text or calls still has one message, with empty text.
The whole (non-streamed) response is built by the same steps over the
whole text, so both hold the same items.
"""

from __future__ import annotations

import uuid
from typing import Any

from hetero_serve_openai.tool_parser import CallDelta, ToolCallParser
from hetero_serve_openai.tools import ToolPlan


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class OutputItems:
    """The items of one response, built from its text as it arrives."""

    def __init__(self, tools: ToolPlan) -> None:
        self.items: list[dict[str, Any]] = []  # finished items
        self._parser = ToolCallParser(tools.names, incremental=tools.is_forced) if tools.parses_calls else None
        self._open: dict[str, Any] | None = None  # the item being written

    @property
    def _index(self) -> int:
        return len(self.items)

    def feed(self, text: str, *, is_last: bool = False) -> list[dict[str, Any]]:
        """The events for more text (``is_last``: the text ends here; call :meth:`finish` next)."""
        if self._parser is None:
            pieces: list[str | CallDelta] = [text]
        else:
            pieces = self._parser.feed(text) + (self._parser.finish() if is_last else [])
        events: list[dict[str, Any]] = []
        for piece in pieces:
            if isinstance(piece, str):
                if piece:
                    events += self._text(piece)
            elif piece.id is not None:
                events += self._close("completed") + self._open_call(piece)
            else:
                events += self._arguments(piece.arguments)
        return events

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close the last item with ``status`` (``completed`` or ``incomplete``); an empty message if there was none."""
        events = [] if self.items or self._open is not None else self._open_message()
        return events + self._close(status)

    def _text(self, text: str) -> list[dict[str, Any]]:
        events = (
            []
            if self._open is not None and self._open["type"] == "message"
            else self._close("completed") + self._open_message()
        )
        assert self._open is not None
        self._open["content"][0]["text"] += text
        events.append(
            {"type": "response.output_text.delta", **self._where(), "content_index": 0, "delta": text, "logprobs": []}
        )
        return events

    def _open_message(self) -> list[dict[str, Any]]:
        self._open = {
            "id": item_id("msg"),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        added = {"type": "response.output_item.added", "output_index": self._index, "item": _copy(self._open)}
        self._open["content"].append(text_part(""))
        part = {"type": "response.content_part.added", **self._where(), "content_index": 0, "part": text_part("")}
        return [added, part]

    def _open_call(self, call: CallDelta) -> list[dict[str, Any]]:
        self._open = {
            "id": item_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "arguments": "",
            "call_id": call.id,
            "name": call.name,
        }
        added = {"type": "response.output_item.added", "output_index": self._index, "item": _copy(self._open)}
        return [added, *self._arguments(call.arguments)]

    def _arguments(self, arguments: str) -> list[dict[str, Any]]:
        if not arguments or self._open is None or self._open["type"] != "function_call":
            return []
        self._open["arguments"] += arguments
        return [{"type": "response.function_call_arguments.delta", **self._where(), "delta": arguments}]

    def _close(self, status: str) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        where = self._where()
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events = [
                {"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **where, "content_index": 0, "part": text_part(text)},
            ]
        else:
            events = [
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            ]
        item["status"] = status
        events.append({"type": "response.output_item.done", "output_index": self._index, "item": _copy(item)})
        self.items.append(item)
        self._open = None
        return events

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": self._index}


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """A snapshot of an item for an event (its content parts go on changing)."""
    return {**item, "content": [dict(part) for part in item["content"]]} if "content" in item else dict(item)
