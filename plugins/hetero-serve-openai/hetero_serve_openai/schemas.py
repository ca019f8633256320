"""OpenAI request bodies, as pydantic models (they also make the server's OpenAPI schema).

A field the server does not implement is refused with a 400 naming it
(``suffix``, ``functions``, ...), never ignored: a client must not
get a 200 that quietly dropped what it asked for. Known fields are strict: ``true`` is not a token id,
``"yes"`` is not a boolean, and ``1.5`` is not an integer; non-finite numbers and strings holding lone
surrogates (which no response could encode) are refused. Ranges are
checked by :class:`GenerationParams`, whose errors name the field.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field, ValidationInfo, WrapValidator, field_validator, model_validator

from hetero_core.params import GenerationParams
from hetero_serve_openai.constraints import ConstraintFields
from hetero_serve_openai.errors import APIError
from hetero_serve_openai.fields import STRICT, JSONObject, Text
from hetero_serve_openai.tools import Tool, ToolFields, ToolPlan

TEMPLATE_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})  # set by the server
ROLES = ("system", "developer", "user", "assistant", "tool")  # developer is OpenAI's newer name for system
TokenIds = list[int]
UNHONOURED_MESSAGE_FIELDS = {  # accepted only null or empty: why a value is refused
    "refusal": "a refusal cannot be sent back: give its text as content",
    "annotations": "annotations are not supported: send null or []",
    "audio": "audio is not supported: this model reads text only",
    "function_call": "function_call is deprecated and not supported: send tool_calls",
}


def _prompt_forms(value: Any, handler: Any, _info: ValidationInfo) -> Any:
    try:
        return handler(value)
    except ValueError as exc:
        if "lone surrogate" in str(exc):
            raise ValueError("prompt must be valid Unicode text (it holds a lone surrogate)") from None
        raise ValueError(
            "must be a string, a list of strings, a list of token ids or a list of lists of token ids"
        ) from None


Prompt = Annotated[Union[Text, list[Text], TokenIds, list[TokenIds]], WrapValidator(_prompt_forms)]


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class SamplingOptions(BaseModel):
    """The sampling fields of every generating endpoint: completions, chat completions and responses."""

    model_config = STRICT

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    priority: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True


class SamplingFields(ConstraintFields, SamplingOptions):
    """What completions and chat completions share."""

    model_config = STRICT

    model: Text | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    prompt_logprobs: int | None = None

    def params(self, max_tokens: int, logprobs: int | None) -> GenerationParams:
        """The engine's parameters (OpenAI's defaults where a field is absent)."""
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options")
        values: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": self.top_k if self.top_k not in (None, 0, -1) else None,  # -1 and 0: no limit, as in vLLM
            "min_p": self.min_p or 0.0,
            "n": self.n,
            "stop": self.stop or (),
            "stop_token_ids": self.stop_token_ids or (),
            "seed": self.seed,
            "presence_penalty": self.presence_penalty or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "repetition_penalty": 1.0 if self.repetition_penalty is None else self.repetition_penalty,
            "ignore_eos": self.ignore_eos,
            "min_tokens": self.min_tokens,
            "logprobs": logprobs,
            "priority": self.priority,
            "structured_output": self.structured_output(),
            "logit_bias": self.token_bias(),
            "prompt_logprobs": self.scored_prompt_logprobs,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
        }
        return GenerationParams(**values)

    @property
    def scored_prompt_logprobs(self) -> int | None:
        """How many alternatives the engine reports per prompt token (None: the prompt is not scored)."""
        return self.prompt_logprobs

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False

    @property
    def echoes_logprobs(self) -> bool:
        """``echo`` with ``logprobs``: the legacy logprobs object covers the prompt tokens too."""
        return self.echo and self.logprobs is not None

    @property
    def scored_prompt_logprobs(self) -> int | None:
        wanted = [k for k in (self.prompt_logprobs, self.logprobs if self.echoes_logprobs else None) if k is not None]
        return max(wanted) if wanted else None


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: Text


class CalledFunction(BaseModel):
    model_config = STRICT

    name: Text
    arguments: Text  # JSON text, as OpenAI sends it


class AssistantToolCall(BaseModel):
    model_config = STRICT

    id: Text
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(BaseModel):
    """One message; ``name`` reaches the chat template, which may show it.

    ``refusal``, ``annotations``, ``audio`` and ``function_call`` are what
    OpenAI's SDKs write when a response message is sent back as it came
    (``message.model_dump()``): null or empty they mean nothing and are
    accepted; a value the server cannot honour is a 400 naming the field.
    """

    model_config = STRICT

    role: Literal[ROLES]  # type: ignore[valid-type]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[AssistantToolCall] | None = None
    tool_call_id: Text | None = None
    refusal: Text | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind is not None and kind != "text":
                raise ValueError(f"{kind} content parts are not supported: this model reads text only")
        return content

    @field_validator("refusal", "annotations", "audio", "function_call")
    @classmethod
    def _only_empty(cls, value: Any, info: ValidationInfo) -> Any:
        if value:
            raise ValueError(UNHONOURED_MESSAGE_FIELDS[info.field_name])
        return value

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if (self.tool_call_id is None) != (self.role != "tool"):
            raise ValueError("a tool message, and only a tool message, needs tool_call_id")
        if self.content is None and not self.tool_calls:
            raise ValueError("content is required (an assistant message may give tool_calls instead)")
        return self

    def to_template(self) -> dict[str, Any]:
        """The message as the chat template takes it (``developer`` is rendered as ``system``)."""
        content = (
            self.content
            if isinstance(self.content, str) or self.content is None
            else "".join(p.text for p in self.content)
        )
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:  # templates read the arguments as an object, as transformers passes them
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type,
                    "function": {"name": c.function.name, "arguments": _object_or_text(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _object_or_text(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


class ChatRendering(BaseModel):
    """How the messages become the prompt; on chat completions and on ``/tokenize``."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: JSONObject | None = None

    def check_rendering(self) -> None:
        """Both true is a 400, as in vLLM: the continued turn cannot also be followed by a new one."""
        reserved = sorted(set(self.chat_template_kwargs or ()) & TEMPLATE_VARIABLES)
        if reserved:
            raise APIError(
                400,
                f"chat_template_kwargs may not set {', '.join(reserved)}: they have fields of their own",
                param="chat_template_kwargs",
            )
        if self.add_generation_prompt and self.continue_final_message:
            raise APIError(
                400,
                "continue_final_message needs add_generation_prompt: false (both cannot be true)",
                param="continue_final_message",
            )


class ChatCompletionRequest(SamplingFields, ToolFields, ChatRendering):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    @functools.cached_property
    def tool_use(self) -> ToolPlan:
        """How this request uses its tools (a 400 naming the field when it contradicts itself)."""
        return self.tool_plan(self.structured_output() is not None)

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (OpenAI's current name) or else ``max_tokens``; 0 is a value, not an absence."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(ChatRendering):
    model_config = STRICT

    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    tools: list[Tool] | None = None  # shown as a chat completion with tool_choice auto shows them


class DetokenizeRequest(BaseModel):
    model_config = STRICT

    model: Text | None = None
    tokens: list[int]
