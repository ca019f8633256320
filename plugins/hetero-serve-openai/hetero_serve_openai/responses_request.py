"""``POST /v1/responses`` request bodies, and the chat completion each one is.

A Responses request runs on the chat route's machinery: :meth:`ResponsesRequest.to_chat`
turns it into a :class:`~hetero_serve_openai.schemas.ChatCompletionRequest`
(``instructions`` as the first system message, input items as messages,
``function_call`` items as assistant ``tool_calls``, ``function_call_output``
items as ``tool`` messages, ``text.format`` as ``response_format``,
``max_output_tokens`` as ``max_completion_tokens``), which is rendered,
checked and generated as a chat is. The chat route's errors name chat
fields; :data:`CHAT_TO_RESPONSES` renames them for this endpoint.

Nothing is stored: ``store`` may be absent, ``null`` or ``false`` (OpenAI
stores by default; this server treats an absent ``store`` as not stored),
and ``store: true`` or ``previous_response_id`` is a 400 naming the field.
Any other field the server cannot honour is refused by name too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hetero_serve_openai.errors import APIError
from hetero_serve_openai.fields import STRICT, Text
from hetero_serve_openai.schemas import ChatCompletionRequest, SamplingOptions
from hetero_serve_openai.tools import FunctionDefinition

CHAT_TO_RESPONSES = {  # a chat field named in an error, and the Responses field it came from
    "messages": "input",
    "prompt": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
}
UNHONOURED = {  # accepted only absent, null, false or empty: why a value is refused
    "store": "true needs stored responses, which this server does not keep: send false or leave it out",
    "previous_response_id": "responses are not stored by this server: send the whole conversation in input",
    "conversation": "conversations are not stored by this server: send the whole conversation in input",
    "background": "background responses are not supported",
    "include": "no output of this server has optional parts to include",
    "verbosity": "verbosity is not supported: this server cannot make a model terser or wordier",
    "include_obfuscation": "stream obfuscation is not supported",
    "annotations": "annotations are not supported: send null or []",
    "logprobs": "logprobs cannot be sent back: send null or []",
}
UNSUPPORTED_ITEMS = {  # input item types, and why they are refused
    "item_reference": "item references need stored items, which this server does not keep: send the item itself",
    "reasoning": "reasoning items are not supported: this model does not reason",
}
ITEM_TYPES = ("message", "function_call", "function_call_output")
NOT_TEXT = "content parts are not supported: this model reads text only"


def _only_empty(value: Any, info: ValidationInfo) -> Any:
    if value:
        raise ValueError(UNHONOURED[info.field_name])
    return value


class InputText(BaseModel):
    model_config = STRICT

    type: Literal["input_text"]
    text: Text


class OutputText(BaseModel):
    """An assistant's text part, as this server's (or OpenAI's) output sends it back."""

    model_config = STRICT

    type: Literal["output_text"]
    text: Text
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None

    _empty = field_validator("annotations", "logprobs")(_only_empty)


def _text_parts_only(content: Any) -> Any:
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in (None, "input_text", "output_text"):
            raise ValueError(f"{kind} {NOT_TEXT}")
    return content


def _as_chat_content(content: str | list[InputText | OutputText]) -> str | list[dict[str, str]]:
    return content if isinstance(content, str) else [{"type": "text", "text": part.text} for part in content]


class MessageItem(BaseModel):
    """A message; ``id`` and ``status`` are what an output message sent back carries."""

    model_config = STRICT

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Text | list[Annotated[Union[InputText, OutputText], Field(discriminator="type")]]
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    _text = field_validator("content", mode="before")(_text_parts_only)


class FunctionCallItem(BaseModel):
    """A call the model made, sent back: it becomes one of an assistant message's ``tool_calls``."""

    model_config = STRICT

    type: Literal["function_call"]
    call_id: Text
    name: Text
    arguments: Text
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(BaseModel):
    """A call's result: it becomes a ``tool`` message answering ``call_id``."""

    model_config = STRICT

    type: Literal["function_call_output"]
    call_id: Text
    output: Text | list[InputText]
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    _text = field_validator("output", mode="before")(_text_parts_only)


def _item_type(item: Any) -> str | None:
    """A message item may leave out its ``type``."""
    return item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)


InputItem = Annotated[
    Union[
        Annotated[MessageItem, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    ],
    Discriminator(_item_type),
]


class FunctionTool(FunctionDefinition):
    """A function tool in the Responses shape (flat, with ``type``); ``strict`` defaults to true, as at OpenAI."""

    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _functions_only(cls, tool: Any) -> Any:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "function"):
            raise ValueError(f"{kind} tools are not supported: only function tools")
        return tool

    @property
    def is_strict(self) -> bool:
        return self.strict is not False

    def to_chat(self) -> dict[str, Any]:
        function = self.model_dump(exclude={"type", "strict"}, exclude_none=True)
        return {"type": "function", "function": function | {"strict": self.is_strict}}

    def echoed(self) -> dict[str, Any]:
        """As the response object lists it."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": self.is_strict,
        }


class FunctionChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    name: Text


class PlainFormat(BaseModel):
    model_config = STRICT

    type: Literal["text", "json_object"]


class JsonSchemaFormat(BaseModel):
    model_config = STRICT

    type: Literal["json_schema"]
    name: Text
    schema_: dict[str, Any] = Field(alias="schema")
    description: Text | None = None
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = STRICT

    format: Annotated[Union[PlainFormat, JsonSchemaFormat], Field(discriminator="type")] | None = None
    verbosity: Any = None

    _empty = field_validator("verbosity")(_only_empty)

    def response_format(self) -> dict[str, Any] | None:
        """The chat route's ``response_format``."""
        if isinstance(self.format, JsonSchemaFormat):
            schema = {
                "name": self.format.name,
                "schema": self.format.schema_,
                "description": self.format.description,
                "strict": self.format.strict,
            }
            return {"type": "json_schema", "json_schema": schema}
        return None if self.format is None else {"type": self.format.type}

    def echoed(self) -> dict[str, Any]:
        if self.format is None:
            return {"format": {"type": "text"}}
        return {"format": self.format.model_dump(by_alias=True, exclude_none=True)}


class StreamOptions(BaseModel):
    model_config = STRICT

    include_obfuscation: bool | None = None

    _empty = field_validator("include_obfuscation")(_only_empty)


class ResponsesRequest(SamplingOptions):
    """The body of ``POST /v1/responses``; the sampling fields are the chat route's."""

    model_config = STRICT

    model: Text | None = None
    input: Text | list[InputItem]
    instructions: Text | None = None
    max_output_tokens: int | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None  # null: the default, true
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    metadata: dict[str, Text] | None = None
    user: Text | None = None
    safety_identifier: Text | None = None
    truncation: Literal["auto", "disabled"] | None = None
    store: bool | None = None
    previous_response_id: Any = None
    conversation: Any = None
    background: bool | None = None
    include: list[Any] | None = None

    _empty = field_validator("store", "previous_response_id", "conversation", "background", "include")(_only_empty)

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("must hold at least one item")
        for number, item in enumerate(value if isinstance(value, list) else ()):
            if not isinstance(item, (dict, BaseModel)):
                raise ValueError(f"item {number}: must be an object")
            kind = _item_type(item)
            if isinstance(kind, str) and kind not in ITEM_TYPES:
                reason = UNSUPPORTED_ITEMS.get(kind, f"{kind} items are not supported (only {', '.join(ITEM_TYPES)})")
                raise ValueError(f"item {number}: {reason}")
        return value

    @field_validator("truncation")
    @classmethod
    def _not_truncated(cls, value: str | None) -> str | None:
        if value == "auto":
            raise ValueError("auto is not supported: an input longer than the context is refused, never cut")
        return value

    def messages(self) -> list[dict[str, Any]]:
        """The chat's messages: ``instructions`` first, then the input items in order."""
        messages: list[dict[str, Any]] = (
            [] if self.instructions is None else [{"role": "system", "content": self.instructions}]
        )
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for number, item in enumerate(items):
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": _as_chat_content(item.content)})
            elif isinstance(item, FunctionCallItem):
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                follows_assistant = (
                    number > 0 and messages[-1]["role"] == "assistant"
                )  # one turn: its text, then its calls
                if follows_assistant:
                    messages[-1].setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            else:
                messages.append(
                    {"role": "tool", "tool_call_id": item.call_id, "content": _as_chat_content(item.output)}
                )
        return messages

    def to_chat(self) -> ChatCompletionRequest:
        """The chat completion this response is; a 400 naming the Responses field if it cannot be one."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self.messages(),
            "max_completion_tokens": self.max_output_tokens,
            "response_format": None if self.text is None else self.text.response_format(),
            "tools": None if self.tools is None else [tool.to_chat() for tool in self.tools],
            "tool_choice": self._chat_tool_choice(),
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "stream": bool(self.stream),
            "user": self.user,
            **self.model_dump(include=set(SamplingOptions.model_fields), exclude_unset=True),
        }
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options")
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:
            error = exc.errors()[0]
            location = [str(part) for part in error.get("loc", ())]
            field = CHAT_TO_RESPONSES.get(location[0], location[0]) if location else None
            raise APIError(
                400, f"{'.'.join([field or '', *location[1:]])}: {error.get('msg', 'invalid')}", param=field
            ) from None

    def _chat_tool_choice(self) -> Any:
        if isinstance(self.tool_choice, FunctionChoice):
            return {"type": "function", "function": {"name": self.tool_choice.name}}
        return self.tool_choice

    def echoed_tool_choice(self) -> Any:
        if isinstance(self.tool_choice, FunctionChoice):
            return self.tool_choice.model_dump()
        return self.tool_choice or ("auto" if self.tools else "none")
