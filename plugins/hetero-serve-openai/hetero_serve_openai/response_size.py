"""A response's size, estimated from its request before any work: past ``server.max_response_bytes`` it is a 400.

Logprobs multiply a response: ``n: 64`` choices that each echo a 2,000-token
prompt with 20 alternatives per token come to about 100 MB of JSON for a
10 KB request. The estimate counts the most a request can return (every
choice runs to ``max_tokens``) at sizes measured on real responses:

| part | bytes |
| --- | --- |
| a token of text | ``TEXT_BYTES_PER_TOKEN`` |
| a logprob entry (the token, or one alternative) | ``ENTRY_BYTES`` (completions), ``CHAT_ENTRY_BYTES`` (chat) |
| a ``prompt_logprobs`` entry (sent once per prompt) | ``PROMPT_ENTRY_BYTES`` |
| a stream chunk (one a token) | ``CHUNK_BYTES`` |

The refusal names the limit and the body field that contributes most.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from hetero_serve_openai.errors import APIError

TEXT_BYTES_PER_TOKEN = 8
ENTRY_BYTES = 40
CHAT_ENTRY_BYTES = 100
PROMPT_ENTRY_BYTES = 80
CHUNK_BYTES = 320
CHOICE_BYTES = 256


@attrs.frozen
class ResponseSize:
    """The estimated bytes of a response, by the body field that asks for them."""

    parts: dict[str, int]

    @property
    def num_bytes(self) -> int:
        return CHOICE_BYTES + sum(self.parts.values())

    def check(self, limit: int) -> None:
        """A 400 naming ``server.max_response_bytes`` and the largest part's field
        when the estimate exceeds ``limit``."""
        if self.num_bytes <= limit:
            return
        field = max(self.parts, key=self.parts.__getitem__)
        raise APIError(
            400,
            f"the response could take about {self.num_bytes:,} bytes (most of them for {field}), over "
            f"server.max_response_bytes ({limit:,}): ask for fewer choices, tokens or logprobs",
            param=field,
        )


def completion_size(
    prompts: Sequence[tuple[int, int]],
    *,
    n: int,
    max_tokens: int,
    logprobs: int | None,
    echo: bool,
    prompt_logprobs: int | None,
    stream: bool,
) -> ResponseSize:
    """``/v1/completions``; ``prompts`` holds each prompt's (tokens, bytes of text)."""
    num_choices = len(prompts) * n
    num_prompt_tokens = sum(tokens for tokens, _ in prompts)
    entries = 0 if logprobs is None else 1 + logprobs
    parts = {
        "max_tokens": num_choices * max_tokens * (TEXT_BYTES_PER_TOKEN + (CHUNK_BYTES if stream else 0)),
        "logprobs": num_choices * max_tokens * entries * ENTRY_BYTES,
        "echo": n * (sum(text for _, text in prompts) + num_prompt_tokens * entries * ENTRY_BYTES) if echo else 0,
        "prompt_logprobs": _prompt_logprobs(num_prompt_tokens, prompt_logprobs),
    }
    return ResponseSize(parts)


def chat_size(
    num_prompt_tokens: int,
    *,
    n: int,
    max_tokens: int,
    max_tokens_field: str,
    top_logprobs: int | None,
    prompt_logprobs: int | None,
    stream: bool,
) -> ResponseSize:
    """``/v1/chat/completions``; ``top_logprobs`` None when no logprobs are asked for."""
    entries = 0 if top_logprobs is None else 1 + top_logprobs
    parts = {
        max_tokens_field: n * max_tokens * (TEXT_BYTES_PER_TOKEN + (CHUNK_BYTES if stream else 0)),
        "top_logprobs": n * max_tokens * entries * CHAT_ENTRY_BYTES,
        "prompt_logprobs": _prompt_logprobs(num_prompt_tokens, prompt_logprobs),
    }
    return ResponseSize(parts)


def _prompt_logprobs(num_prompt_tokens: int, num_top: int | None) -> int:
    return 0 if num_top is None else num_prompt_tokens * (1 + num_top) * PROMPT_ENTRY_BYTES
