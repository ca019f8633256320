"""Shaping results as OpenAI's response and stream-chunk objects, for completions and for chat.

No non-finite number reaches a client: a logprob of minus infinity (a token
the request's parameters ruled out) is sent as -9999.0, as OpenAI does, and
any other non-finite number is a fault that fails the request with a
logged 500 rather than an invalid JSON document.

Prompt logprobs take two shapes. ``echo`` with ``logprobs`` on completions
puts the prompt's tokens first in the legacy logprobs object, the first
with a ``null`` logprob and ``null`` top alternatives (as OpenAI did).
vLLM's ``prompt_logprobs: K`` adds a ``prompt_logprobs`` list (per choice on
completions, on the response for chat): ``null`` for the first prompt
token, then per token ``{token_id: {"logprob", "rank", "decoded_token"}}``
for the prompt token and the K most likely ones. Streamed, both come in
the first chunk of each choice.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hetero_core.batch import TokenLogprobs
from hetero_core.outputs import StreamDelta
from hetero_core.server.generation import Choice, Generation
from hetero_core.server.schemas import ChatCompletionRequest, CompletionRequest

IMPOSSIBLE_LOGPROB = -9999.0

SSE_DONE = "data: [DONE]\n\n"


def sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, allow_nan=False)}\n\n"


def finite_logprob(value: float) -> float:
    if value == -math.inf:
        return IMPOSSIBLE_LOGPROB
    if not math.isfinite(value):
        raise ValueError(f"the engine produced a non-finite logprob ({value})")
    return value


def finish_reason(choice: Choice) -> str | None:
    return None if choice.finish_reason is None else choice.finish_reason.value


def envelope(kind: str, request_id: str, created: int, model: str, choices: list[dict], usage: dict | None = None) -> dict[str, Any]:
    """A response or stream chunk; every chunk of one stream carries the same ``id`` and ``created``."""
    body: dict[str, Any] = {"id": request_id, "object": kind, "created": created, "model": model, "choices": choices}
    if usage is not None or kind in ("text_completion", "chat.completion"):
        body["usage"] = usage
    return body


def vllm_prompt_logprobs(tokenizer: Any, scored: list[TokenLogprobs | None] | None, num_top: int) -> list | None:
    """vLLM's ``prompt_logprobs``: the prompt token first (with its true rank), then the ``num_top`` most likely."""
    if scored is None:
        return None

    def entry(token_id: int, logprob: float, rank: int) -> dict[str, Any]:
        return {"logprob": finite_logprob(logprob), "rank": rank, "decoded_token": tokenizer.decode([token_id], skip_special_tokens=False)}

    result: list[dict[str, Any] | None] = [None]
    for scoring in scored[1:]:
        ranked = {str(scoring.token_id): entry(scoring.token_id, scoring.logprob, scoring.rank)}
        for rank, (token_id, logprob) in enumerate(scoring.top[:num_top], start=1):
            ranked.setdefault(str(token_id), entry(token_id, logprob, rank))
        result.append(ranked)
    return result


class CompletionFormat:
    """``/v1/completions``: text choices, ``echo``, the legacy logprobs object."""

    response_object = chunk_object = "text_completion"

    def __init__(self, body: CompletionRequest, tokenizer: Any, generation: Generation) -> None:
        self.body, self.tokenizer, self.generation = body, tokenizer, generation
        self._echoed: set[int] = set()

    def opening(self) -> list[dict]:
        return []

    def _prefix(self, choice: Choice) -> str:
        if not self.body.echo:
            return ""
        prompt = self.generation.inputs[choice.index // self.generation.params.n][0]
        return prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt, skip_special_tokens=False)

    def _logprobs(self, choice: Choice, entries: list[TokenLogprobs], text_offset: int, *, with_prompt: bool) -> dict | None:
        if self.body.logprobs is None:
            return None
        legacy: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if with_prompt and self.body.echoes_logprobs and choice.prompt_logprobs is not None:
            prompt_ids = self.generation.inputs[choice.index // self.generation.params.n][0]  # ids: see completion_inputs
            self._add(legacy, zip(prompt_ids, choice.prompt_logprobs), 0)
        self._add(legacy, ((entry.token_id, entry) for entry in entries), text_offset)
        return legacy

    def _add(self, legacy: dict[str, list], entries: Any, offset: int) -> None:
        """Append (token id, its TokenLogprobs or None for the first prompt token) pairs to the legacy object."""
        for token_id, entry in entries:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            legacy["tokens"].append(text)
            legacy["text_offset"].append(offset)
            offset += len(text)
            if entry is None:
                legacy["token_logprobs"].append(None)
                legacy["top_logprobs"].append(None)
                continue
            legacy["token_logprobs"].append(finite_logprob(entry.logprob))
            top = entry.top[: self.body.logprobs]
            legacy["top_logprobs"].append({self.tokenizer.decode([t], skip_special_tokens=False): finite_logprob(lp) for t, lp in top})

    def _with_prompt_logprobs(self, payload: dict, choice: Choice) -> dict:
        if self.body.prompt_logprobs is not None:
            payload["prompt_logprobs"] = vllm_prompt_logprobs(self.tokenizer, choice.prompt_logprobs, self.body.prompt_logprobs)
        return payload

    def chunk(self, choice: Choice, delta: StreamDelta) -> dict | None:
        text = delta.text
        is_first = choice.index not in self._echoed
        if is_first:
            self._echoed.add(choice.index)
            text = self._prefix(choice) + text
        if not text and not delta.finish_reason and not delta.token_ids:
            return None
        offset = len(choice.text) - len(delta.text)
        logprobs = self._logprobs(choice, delta.logprobs or [], offset, with_prompt=is_first)
        payload = {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(choice)}
        return self._with_prompt_logprobs(payload, choice) if is_first else payload

    def whole(self, choice: Choice) -> dict:
        prefix = self._prefix(choice)
        logprobs = self._logprobs(choice, choice.logprobs, len(prefix), with_prompt=True)
        payload = {"index": choice.index, "text": prefix + choice.text, "logprobs": logprobs, "finish_reason": finish_reason(choice)}
        return self._with_prompt_logprobs(payload, choice)

    def response_fields(self, choices: list[Choice]) -> dict:
        return {}


class ChatFormat:
    """``/v1/chat/completions``: assistant messages, a role chunk first, the chat logprobs object."""

    response_object, chunk_object = "chat.completion", "chat.completion.chunk"

    def __init__(self, body: ChatCompletionRequest, tokenizer: Any, generation: Generation) -> None:
        self.body, self.tokenizer, self.generation = body, tokenizer, generation

    def opening(self) -> list[dict]:
        return [
            {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for index in range(len(self.generation.choices))
        ]

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": text, "logprob": finite_logprob(logprob), "bytes": list(text.encode())}

    def _logprobs(self, entries: list[TokenLogprobs]) -> dict | None:
        if not self.body.logprobs:
            return None
        return {"content": [{**self._entry(e.token_id, e.logprob), "top_logprobs": [self._entry(t, lp) for t, lp in e.top]} for e in entries]}

    def chunk(self, choice: Choice, delta: StreamDelta) -> dict | None:
        if not delta.text and not delta.finish_reason and not delta.token_ids:
            return None
        content = {"content": delta.text} if delta.text else {}
        return {"index": choice.index, "delta": content, "logprobs": self._logprobs(delta.logprobs or []), "finish_reason": finish_reason(choice)}

    def whole(self, choice: Choice) -> dict:
        message = {"role": "assistant", "content": choice.text}
        return {"index": choice.index, "message": message, "logprobs": self._logprobs(choice.logprobs), "finish_reason": finish_reason(choice)}

    def response_fields(self, choices: list[Choice]) -> dict:
        """vLLM's ``prompt_logprobs`` belong to the chat response (one prompt for every choice)."""
        if self.body.prompt_logprobs is None:
            return {}
        return {"prompt_logprobs": vllm_prompt_logprobs(self.tokenizer, choices[0].prompt_logprobs, self.body.prompt_logprobs)}
