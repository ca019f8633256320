"""Render a model's Jinja chat template the way Hugging Face ``transformers`` does."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hetero_core.errors import ValidationError
from hetero_core.messages import check_messages


def _raise(message: str) -> None:
    raise ValidationError(f"chat template: {message}", param="messages")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may use."""

    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = environment.from_string(source)
        except jinja2.TemplateError as exc:
            raise ValidationError(f"the model's chat template does not compile: {exc}") from exc
        self._bos_token = bos_token
        self._eos_token = eos_token

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool) -> str:
        check_messages(messages)
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except jinja2.TemplateError as exc:
            raise ValidationError(f"chat template failed: {exc}", param="messages") from exc
