"""From a request body to what the backend is given: the prompts and the engine's parameters.

These run on a worker thread (see :class:`~hetero_serve_openai.generation.Generation`):
tokenizing a long prompt or rendering a chat template never blocks the
event loop, and a chat prompt is encoded once, both to size the default
``max_tokens`` and to submit.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs

from hetero_core.config import EngineConfig
from hetero_core.params import GenerationParams
from hetero_core.protocols import Tokenizer
from hetero_core.serving import ServingBackend
from hetero_core.tool_prompt import inline_tools
from hetero_serve_openai.backend import backend_name
from hetero_serve_openai.capabilities import capabilities_of, check_capabilities
from hetero_serve_openai.config import server_config
from hetero_serve_openai.errors import APIError
from hetero_serve_openai.generation import Input, Prepare
from hetero_serve_openai.response_size import TEXT_BYTES_PER_TOKEN, chat_size, completion_size
from hetero_serve_openai.schemas import ChatCompletionRequest, ChatRendering, CompletionRequest

CHAT_DEFAULT_MAX_TOKENS = 1024  # when the body names no limit: this, or what the context has left


def completion_inputs(body: CompletionRequest, backend: ServingBackend, config: EngineConfig) -> Prepare:
    def prepare() -> tuple[list[Input], GenerationParams]:
        inputs = [(prompt, None) for prompt in _prompts(body.prompt)]
        if len(inputs) > config.max_waiting_requests:  # it could never be queued whole
            raise APIError(
                400,
                f"{len(inputs)} prompts exceed max_waiting_requests ({config.max_waiting_requests}) of this server",
                param="prompt",
            )
        params = body.params(body.max_tokens if body.max_tokens is not None else 16, body.logprobs)
        scoring = "prompt_logprobs" if body.prompt_logprobs is not None else "echo"
        _check_capabilities(
            params, backend, config, {"structured_output": body.constraint_field, "prompt_logprobs": scoring}
        )
        _check_request_size(len(inputs), params, backend, config)
        _check_prompt_scoring(params, backend, scoring)
        if params.prompt_logprobs is not None:  # the response names each prompt token
            inputs = [(backend.tokenizer.encode(p) if isinstance(p, str) else p, None) for p, _ in inputs]
        # no choice outlasts the context: past it the request is refused as too long, not as too large
        longest = min(params.max_tokens, backend.max_model_len or params.max_tokens)
        size = completion_size(
            [_prompt_size(p) for p, _ in inputs],
            n=params.n,
            max_tokens=longest,
            logprobs=body.logprobs,
            echo=body.echo,
            prompt_logprobs=body.prompt_logprobs,
            stream=body.stream,
        )
        size.check(server_config(config).max_response_bytes)
        return inputs, params

    return prepare


def chat_inputs(body: ChatCompletionRequest, backend: ServingBackend, config: EngineConfig) -> Prepare:
    def prepare() -> tuple[list[Input], GenerationParams]:
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
        if body.prompt_logprobs is not None and body.stream:
            raise APIError(
                400, "prompt_logprobs is not supported with stream: true on chat completions", param="prompt_logprobs"
            )
        least = 0 if body.prompt_logprobs is not None else 1  # 0 only scores the prompt
        if body.max_completion_tokens is not None and body.max_completion_tokens < least:
            raise APIError(
                400,
                f"max_completion_tokens must be at least {least}, got {body.max_completion_tokens}",
                param="max_completion_tokens",
            )
        plan = body.tool_use
        messages = [message.to_template() for message in body.messages]
        prompt: Sequence[int] | None = None
        context_left = CHAT_DEFAULT_MAX_TOKENS
        if backend.tokenizer is not None and backend.max_model_len is not None:  # encode once, here
            text = render_chat(backend.tokenizer, messages, body, plan.tools)
            prompt = backend.tokenizer.encode(text, add_special_tokens=False)
            context_left = backend.max_model_len - len(prompt)
        else:
            messages = _plain_chat(messages, body, plan.tools)
        max_tokens = body.requested_max_tokens
        if max_tokens is None:
            max_tokens = max(1, min(CHAT_DEFAULT_MAX_TOKENS, context_left))
        params = body.params(max_tokens, (body.top_logprobs or 0) if body.logprobs else None)
        if plan.constraint is not None:
            params = attrs.evolve(params, structured_output=plan.constraint)
        constraint_field = (
            ("tool_choice" if plan.is_forced else "tools") if plan.constraint is not None else body.constraint_field
        )
        _check_capabilities(params, backend, config, {"structured_output": constraint_field})
        _check_request_size(1, params, backend, config)
        _check_prompt_scoring(params, backend, "prompt_logprobs")
        size = chat_size(
            len(prompt or ()),
            n=params.n,
            max_tokens=max_tokens if prompt is None else min(max_tokens, max(context_left, 0)),
            max_tokens_field="max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens",
            top_logprobs=params.logprobs,
            prompt_logprobs=body.prompt_logprobs,
            stream=body.stream,
        )
        size.check(server_config(config).max_response_bytes)
        return [(prompt, None) if prompt is not None else (None, messages)], params

    return prepare


def render_chat(
    tokenizer: Tokenizer, messages: list[dict[str, Any]], rendering: ChatRendering, tools: Sequence[Mapping[str, Any]]
) -> str:
    """The prompt text of a chat, rendered as the body asks (``add_generation_prompt``,
    ``continue_final_message``, ...)."""
    rendering.check_rendering()
    return tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=rendering.add_generation_prompt,
        continue_final_message=rendering.continue_final_message,
        tools=tools or None,
        template_kwargs=rendering.chat_template_kwargs,
    )


def _plain_chat(
    messages: list[dict[str, Any]], rendering: ChatRendering, tools: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """For a backend that renders chats itself: plain messages
    (tools in the default convention) and no rendering options."""
    rendering.check_rendering()
    for name in ("continue_final_message", "chat_template_kwargs"):
        if getattr(rendering, name):
            raise APIError(400, f"{name} needs a backend with a tokenizer; this one renders chats itself", param=name)
    if not rendering.add_generation_prompt:
        raise APIError(
            400, "add_generation_prompt: false needs a backend with a tokenizer", param="add_generation_prompt"
        )
    return inline_tools(messages, tools)


def _prompts(prompt: Any) -> list[str | list[int]]:
    """OpenAI's prompt forms: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [prompt]
    return list(prompt)


def _prompt_size(prompt: str | Sequence[int]) -> tuple[int, int]:
    """A prompt's (tokens, bytes of text) for :func:`completion_size`.

    A text prompt's tokens count only when it is scored, and a scored prompt
    has been encoded by then.
    """
    if isinstance(prompt, str):
        return 0, len(prompt.encode())
    return len(prompt), len(prompt) * TEXT_BYTES_PER_TOKEN


def _check_prompt_scoring(params: GenerationParams, backend: ServingBackend, param: str) -> None:
    """A backend without a tokenizer (the command bridge) cannot score a prompt: refused, not answered without it."""
    if params.prompt_logprobs is not None and backend.tokenizer is None:
        raise APIError(400, "this server's backend cannot score prompts (it has no tokenizer)", param=param)


def _check_capabilities(
    params: GenerationParams, backend: ServingBackend, config: EngineConfig, fields: dict[str, str | None]
) -> None:
    name = backend_name(config)
    check_capabilities(params, capabilities_of(backend, name), name, fields)


def _check_request_size(
    num_inputs: int, params: GenerationParams, backend: ServingBackend, config: EngineConfig
) -> None:
    limit = server_config(config).max_choices_per_request
    if num_inputs * params.n > limit:
        raise APIError(
            400,
            f"{num_inputs} prompts x n={params.n} make {num_inputs * params.n} choices, "
            f"over server.max_choices_per_request ({limit})",
            param="n",
        )
    tokenizer = backend.tokenizer
    if tokenizer is not None:
        bad = [t for t in params.stop_token_ids if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise APIError(
                400, f"stop_token_ids must be in [0, {tokenizer.vocab_size}), got {bad[0]}", param="stop_token_ids"
            )
