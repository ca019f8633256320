"""Render a model's Jinja chat template exactly as Hugging Face ``transformers`` does.

Same environment: sandboxed and immutable, ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}``
block that renders its body, ``raise_exception``, ``strftime_now``, a
``tojson`` that does not escape HTML, and a ``namespace`` that refuses
underscore names. Same variables: ``messages``, ``tools``, ``documents``,
``add_generation_prompt``, the special tokens (``bos_token``, ...) and any
``chat_template_kwargs``; ``continue_final_message`` cuts the text right after
the last message's content (found by a marker appended to it), as transformers does. A template that never reads
``tools`` gets tools and tool history in the default convention of
:mod:`hetero_core.tool_prompt`.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime
from typing import Any, Mapping, NoReturn, Sequence

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hetero_core.errors import ConfigError, ValidationError
from hetero_core.messages import check_messages, has_tool_history
from hetero_core.tool_prompt import inline_tools

RESERVED = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt"}
)  # set by the caller, not by chat_template_kwargs


class GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks the assistant's text for training masks;
    here it renders as is."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class SafeNamespace(jinja2.utils.Namespace):
    """Jinja's ``namespace()``, refusing attribute names that start with an underscore."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 -- Namespace's own calling convention
        self, attributes = args[0], dict(*args[1:], **kwargs)
        for name in attributes:
            SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with an underscore")


class DictFactory:
    """``dict(...)`` and ``dict.fromkeys(...)`` for templates, without exposing the ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict:
        return dict.fromkeys(keys, value)


def _raise_exception(message: str) -> NoReturn:
    raise ValidationError(f"chat template: {message}", param="messages")


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=SafeNamespace, dict=DictFactory()
    )
    return environment


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may refer to."""

    def __init__(self, source: str, *, special_tokens: Mapping[str, str]) -> None:
        environment = _environment()
        try:
            self._template = environment.from_string(source)
            variables = jinja2.meta.find_undeclared_variables(environment.parse(source))
        except jinja2.TemplateError as exc:
            raise ConfigError(f"the model's chat template does not compile: {exc}", param="tokenizer") from exc
        self._special_tokens = dict(special_tokens)
        self.renders_tools = "tools" in variables

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text; ``ValidationError`` for malformed messages or ones the template rejects.

        A template that does not read ``tools`` gets the tools and the tool
        history in the default convention (:func:`hetero_core.tool_prompt.inline_tools`).
        """
        check_messages(messages)
        if not self.renders_tools and (tools or has_tool_history(messages)):
            messages, tools = inline_tools(messages, tools), None
        # Like transformers: a key set to None is left out, since templates test for presence.
        plain = [{key: value for key, value in message.items() if value is not None} for message in messages]
        marker = f"<continue-here-{secrets.token_hex(8)}>" if continue_final_message else ""
        if marker:
            if not isinstance(plain[-1].get("content"), str):
                raise ValidationError("continue_final_message needs a last message with text content", param="messages")
            plain[-1]["content"] += marker
        variables = dict(template_kwargs or {})
        reserved = sorted(set(variables) & (RESERVED | set(self._special_tokens)))
        if reserved:
            raise ValidationError(
                f"chat_template_kwargs may not set {', '.join(reserved)}", param="chat_template_kwargs"
            )
        try:
            text = self._template.render(
                **self._special_tokens,
                **variables,
                messages=plain,
                tools=list(tools) if tools else None,
                documents=None,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
            )
        except (jinja2.TemplateError, TypeError, ValueError) as exc:
            raise ValidationError(f"chat template cannot render these messages: {exc}", param="messages") from exc
        if not marker:
            return text
        if marker not in text:  # the template left out or altered the last message
            raise ValidationError(
                "continue_final_message: the chat template does not render the last message's end", param="messages"
            )
        return text[: text.rindex(marker)]
