"""A response's output items and their stream events, from text fed whole or in pieces."""

from __future__ import annotations

import json

import pytest

from hetero_serve_openai.responses_output import OutputItems, text_part
from hetero_serve_openai.tools import NO_TOOLS, ToolPlan

AUTO = ToolPlan((), frozenset({"f"}), None, True)
CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


def built(plan: ToolPlan, pieces: list[str], status: str = "completed") -> tuple[list[dict], list[dict]]:
    items = OutputItems(plan)
    events = [
        event for number, piece in enumerate(pieces) for event in items.feed(piece, is_last=number == len(pieces) - 1)
    ]
    return items.items, events + items.finish(status)


def without_ids(items: list[dict]) -> list[dict]:
    return [{key: value for key, value in item.items() if key not in ("id", "call_id")} for item in items]


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_text_then_a_call_is_a_message_then_a_function_call(size) -> None:
    text = f"Let me look. {CALL}"
    items, events = built(AUTO, [text[i : i + size] for i in range(0, len(text), size)])
    assert without_ids(items) == [
        {"type": "message", "status": "completed", "role": "assistant", "content": [text_part("Let me look. ")]},
        {"type": "function_call", "status": "completed", "arguments": '{"a": 1}', "name": "f"},
    ]
    kinds = [event["type"] for event in events if not event["type"].endswith(".delta")]
    assert kinds == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [event["output_index"] for event in events if event["type"] == "response.output_item.done"] == [0, 1]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Let me look. "
    assert json.loads("".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")) == {
        "a": 1
    }


def test_no_text_is_one_empty_message_and_a_cut_is_incomplete() -> None:
    items, events = built(NO_TOOLS, [""], status="incomplete")
    assert [item["content"][0]["text"] for item in items] == [""] and items[0]["status"] == "incomplete"
    assert [event["type"] for event in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]


def test_events_carry_snapshots_not_the_growing_item() -> None:
    items, events = built(NO_TOOLS, ["ab", "c"])
    assert events[0]["item"]["content"] == [] and events[0]["item"]["status"] == "in_progress"
    assert events[-1]["item"]["content"][0]["text"] == "abc" == items[0]["content"][0]["text"]
