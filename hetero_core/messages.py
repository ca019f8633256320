"""OpenAI-style chat messages, as every tokenizer's chat template receives them."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hetero_core.errors import ValidationError


def check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """A non-empty list of objects, each with a string ``role`` and a string ``content``."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValidationError("messages must be a non-empty list", param="messages")
    for number, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValidationError(f"messages[{number}] must be an object", param="messages")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise ValidationError(f"messages[{number}].{key} must be a string", param="messages")
