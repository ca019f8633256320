"""OpenAI request bodies, as pydantic models (they also make the server's OpenAPI schema).

A field the server does not implement is refused with a 400 naming it
(``tools``, ``suffix``, ``functions``, ...), never ignored: a client must not
get a 200 that quietly dropped what it asked for. Known fields are strict: ``true`` is not a token id, ``"yes"`` is not a boolean, and
``1.5`` is not an integer; non-finite numbers and strings holding lone
surrogates (which no response could encode) are refused. Ranges are
checked by :class:`GenerationParams`, whose errors name the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, WrapValidator, field_validator

from hetero_core.params import GenerationParams
from hetero_core.server.constraints import ConstraintFields
from hetero_core.server.errors import APIError

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
ROLES = ("system", "developer", "user", "assistant")  # developer is OpenAI's newer name for system


def _encodable(text: str) -> str:
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (it holds a lone surrogate)") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]
TokenIds = list[int]


def _prompt_forms(value: Any, handler: Any, _info: ValidationInfo) -> Any:
    try:
        return handler(value)
    except ValueError as exc:
        if "lone surrogate" in str(exc):
            raise ValueError("prompt must be valid Unicode text (it holds a lone surrogate)") from None
        raise ValueError("must be a string, a list of strings, a list of token ids or a list of lists of token ids") from None


Prompt = Annotated[Union[Text, list[Text], TokenIds, list[TokenIds]], WrapValidator(_prompt_forms)]


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class SamplingFields(ConstraintFields):
    """What completions and chat completions share."""

    model_config = STRICT

    model: Text | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    stop: Text | list[Text] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    priority: int = 0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def params(self, max_tokens: int, logprobs: int | None) -> GenerationParams:
        """The engine's parameters (OpenAI's defaults where a field is absent)."""
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options")
        values: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": self.top_k if self.top_k not in (None, 0, -1) else None,
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


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal[ROLES]  # type: ignore[valid-type]
    content: Text | list[TextPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind is not None and kind != "text":
                raise ValueError(f"{kind} content parts are not supported: this model reads text only")
        return content

    def to_template(self) -> dict[str, str]:
        """The message as the chat template takes it (``developer`` is rendered as ``system``)."""
        content = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content or ())
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (OpenAI's current name) or else ``max_tokens``; 0 is a value, not an absence."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(BaseModel):
    model_config = STRICT

    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = STRICT

    model: Text | None = None
    tokens: list[int]
