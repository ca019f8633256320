"""OpenAI-style chat messages, as every tokenizer's chat template receives them.

A message has a string ``role`` and a string ``content``, with two
exceptions from tool calling: an assistant message that carries
``tool_calls`` (``[{"id", "type": "function", "function": {"name",
"arguments"}}]``, the arguments an object or its JSON text) may have no
content, and a ``tool`` message answers one call and names it with
``tool_call_id``. A message may carry a ``name`` (the participant's), which
templates may show.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hetero_core.errors import ValidationError


def check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """A non-empty list of objects, each with a string ``role`` and a string ``content`` (or assistant
    ``tool_calls``)."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValidationError("messages must be a non-empty list", param="messages")
    for number, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValidationError(f"messages[{number}] must be an object", param="messages")
        if not isinstance(message.get("role"), str):
            raise ValidationError(f"messages[{number}].role must be a string", param="messages")
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            _check_tool_calls(number, message["role"], tool_calls)
        content = message.get("content")
        if not isinstance(content, str) and not (content is None and tool_calls):
            raise ValidationError(f"messages[{number}].content must be a string", param="messages")


def _check_tool_calls(number: int, role: str, tool_calls: Any) -> None:
    if role != "assistant":
        raise ValidationError(f"messages[{number}]: only assistant messages carry tool_calls", param="messages")
    if not isinstance(tool_calls, Sequence) or isinstance(tool_calls, str):
        raise ValidationError(f"messages[{number}].tool_calls must be a list", param="messages")
    for call in tool_calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValidationError(f"messages[{number}].tool_calls: each call needs function.name", param="messages")
        if not isinstance(function.get("arguments"), (str, Mapping)):
            raise ValidationError(
                f"messages[{number}].tool_calls: each call needs function.arguments", param="messages"
            )


def has_tool_history(messages: Sequence[Mapping[str, Any]]) -> bool:
    """True when an assistant message carries tool calls or a tool message answers one."""
    return any(message.get("tool_calls") or message.get("role") == "tool" for message in messages)
