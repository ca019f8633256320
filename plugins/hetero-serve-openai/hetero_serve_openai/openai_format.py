"""Shaping results as OpenAI's response and stream-chunk objects, for completions and for chat.

No non-finite number reaches a client: a logprob of minus infinity (a token
the request's parameters ruled out) is sent as -9999.0, as OpenAI does, and
any other non-finite number is a fault that fails the request with a
logged 500 rather than an invalid JSON document.

Prompt logprobs take two shapes. ``echo`` with ``logprobs`` on completions
puts the prompt's tokens first in the legacy logprobs object, the first
with a ``null`` logprob and ``null`` top alternatives (as OpenAI did).
vLLM's ``prompt_logprobs: K`` adds a ``prompt_logprobs`` list, once per
prompt: on the first of its ``n`` choices on completions (the others carry
``null``), on the response for chat. It holds ``null`` for the first prompt
token, then per token ``{token_id: {"logprob", "rank", "decoded_token"}}``
for the prompt token and the K most likely ones. Streamed, both come in
the first chunk of a choice. The legacy object is per choice by its format,
so ``echo`` repeats the prompt's logprobs in each.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hetero_core.batch import TokenLogprobs
from hetero_core.outputs import StreamDelta
from hetero_core.sequence import FinishReason
from hetero_serve_openai.generation import Choice, Generation
from hetero_serve_openai.schemas import ChatCompletionRequest, CompletionRequest
from hetero_serve_openai.tool_parser import CallDelta, Piece, ToolCallParser, parse_tool_calls

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


def envelope(
    kind: str, request_id: str, created: int, model: str, choices: list[dict], usage: dict | None = None
) -> dict[str, Any]:
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
        return {
            "logprob": finite_logprob(logprob),
            "rank": rank,
            "decoded_token": tokenizer.decode([token_id], skip_special_tokens=False),
        }

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

    def _logprobs(
        self, choice: Choice, entries: list[TokenLogprobs], text_offset: int, *, with_prompt: bool
    ) -> dict | None:
        if self.body.logprobs is None:
            return None
        legacy: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if with_prompt and self.body.echoes_logprobs and choice.prompt_logprobs is not None:
            prompt_ids = self.generation.inputs[choice.index // self.generation.params.n][
                0
            ]  # ids: see completion_inputs
            self._add(legacy, zip(prompt_ids, choice.prompt_logprobs, strict=True), 0)
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
            legacy["top_logprobs"].append(
                {self.tokenizer.decode([t], skip_special_tokens=False): finite_logprob(lp) for t, lp in top}
            )

    def _with_prompt_logprobs(self, payload: dict, choice: Choice) -> dict:
        """vLLM's ``prompt_logprobs`` on the first choice of each prompt; ``null`` on its other ``n - 1`` choices."""
        if self.body.prompt_logprobs is not None:
            is_first_of_prompt = choice.index % self.generation.params.n == 0
            scored = choice.prompt_logprobs if is_first_of_prompt else None
            payload["prompt_logprobs"] = vllm_prompt_logprobs(self.tokenizer, scored, self.body.prompt_logprobs)
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
        payload = {
            "index": choice.index,
            "text": prefix + choice.text,
            "logprobs": logprobs,
            "finish_reason": finish_reason(choice),
        }
        return self._with_prompt_logprobs(payload, choice)

    def response_fields(self, choices: list[Choice]) -> dict:
        return {}


class ChatFormat:
    """``/v1/chat/completions``: assistant messages, a role chunk first, the chat logprobs object, tool calls.

    With tools in use, each choice's text goes through a :class:`ToolCallParser`:
    ``<tool_call>`` blocks become ``tool_calls`` (streamed as OpenAI streams
    them) and the finish reason of a choice that stopped after calling is
    ``tool_calls``. Logprobs cover every generated token, tool-call text included.
    """

    response_object, chunk_object = "chat.completion", "chat.completion.chunk"

    def __init__(self, body: ChatCompletionRequest, tokenizer: Any, generation: Generation) -> None:
        self.body, self.tokenizer, self.generation = body, tokenizer, generation
        self.tools = body.tool_use
        self._parsers: dict[int, ToolCallParser] = {}

    def opening(self) -> list[dict]:
        content = None if self.tools.is_forced else ""
        return [
            {
                "index": index,
                "delta": {"role": "assistant", "content": content},
                "logprobs": None,
                "finish_reason": None,
            }
            for index in range(len(self.generation.choices))
        ]

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": text, "logprob": finite_logprob(logprob), "bytes": list(text.encode())}

    def _logprobs(self, entries: list[TokenLogprobs]) -> dict | None:
        if not self.body.logprobs:
            return None
        return {
            "content": [
                {**self._entry(e.token_id, e.logprob), "top_logprobs": [self._entry(t, lp) for t, lp in e.top]}
                for e in entries
            ]
        }

    def _finish_reason(self, choice: Choice, num_calls: int, is_cut: bool) -> str | None:
        """``tool_calls`` for a choice that stopped after calling, unless a stop string cut its last call short."""
        if choice.finish_reason is FinishReason.STOP and num_calls and not is_cut:
            return "tool_calls"
        return finish_reason(choice)

    def chunk(self, choice: Choice, delta: StreamDelta) -> dict | None:
        if not delta.text and not delta.finish_reason and not delta.token_ids:
            return None
        num_calls, is_cut, message = 0, False, {"content": delta.text} if delta.text else {}
        if self.tools.parses_calls:
            parser = self._parsers.setdefault(
                choice.index, ToolCallParser(self.tools.names, incremental=self.tools.is_forced)
            )
            pieces = parser.feed(delta.text) + (parser.finish() if delta.finish_reason else [])
            message, num_calls, is_cut = _stream_delta(pieces), parser.num_calls, parser.is_cut
            if not message and not delta.finish_reason and not self.body.logprobs:
                return None  # held back: part of a tag, or arguments that may end the call
        return {
            "index": choice.index,
            "delta": message,
            "logprobs": self._logprobs(delta.logprobs or []),
            "finish_reason": self._finish_reason(choice, num_calls, is_cut),
        }

    def whole(self, choice: Choice) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": choice.text}
        calls: list[CallDelta] = []
        is_cut = False
        if self.tools.parses_calls:
            content, calls, is_cut = parse_tool_calls(choice.text, self.tools.names, incremental=self.tools.is_forced)
            message["content"] = content or (None if calls else content)
        if calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in calls
            ]
        return {
            "index": choice.index,
            "message": message,
            "logprobs": self._logprobs(choice.logprobs),
            "finish_reason": self._finish_reason(choice, len(calls), is_cut),
        }

    def response_fields(self, choices: list[Choice]) -> dict:
        """vLLM's ``prompt_logprobs`` belong to the chat response (one prompt for every choice)."""
        if self.body.prompt_logprobs is None:
            return {}
        return {
            "prompt_logprobs": vllm_prompt_logprobs(
                self.tokenizer, choices[0].prompt_logprobs, self.body.prompt_logprobs
            )
        }


def _stream_delta(pieces: list[Piece]) -> dict[str, Any]:
    """One chunk's ``delta`` from parsed pieces: content, and tool-call parts merged by call index."""
    content = "".join(piece for piece in pieces if isinstance(piece, str))
    calls: dict[int, dict[str, Any]] = {}
    for piece in pieces:
        if isinstance(piece, str):
            continue
        if piece.index not in calls:
            calls[piece.index] = {"index": piece.index, "function": {"arguments": ""}}
            if piece.id is not None:
                calls[piece.index].update(id=piece.id, type="function")
                calls[piece.index]["function"]["name"] = piece.name
        calls[piece.index]["function"]["arguments"] += piece.arguments
    delta: dict[str, Any] = {"content": content} if content else {}
    if calls:
        delta["tool_calls"] = list(calls.values())
    return delta
