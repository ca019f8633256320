"""Shaping results as OpenAI's response and stream-chunk objects, for completions and for chat.

No non-finite number reaches a client: a logprob of minus infinity (a token
the request's parameters ruled out) is sent as -9999.0, as OpenAI does, and
any other non-finite number is a fault that fails the request with a
logged 500 rather than an invalid JSON document.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hetero_core.batch import TokenLogprobs
from hetero_core.outputs import StreamDelta
from hetero_core.sequence import FinishReason
from hetero_core.server.generation import Choice, Generation
from hetero_core.server.schemas import ChatCompletionRequest, CompletionRequest
from hetero_core.server.tool_parser import CallDelta, Piece, ToolCallParser, parse_tool_calls

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

    def _logprobs(self, entries: list[TokenLogprobs], text_offset: int) -> dict | None:
        if self.body.logprobs is None:
            return None
        tokens, token_logprobs, top, offsets = [], [], [], []
        offset = text_offset
        for entry in entries:
            text = self.tokenizer.decode([entry.token_id], skip_special_tokens=False)
            tokens.append(text)
            token_logprobs.append(finite_logprob(entry.logprob))
            top.append({self.tokenizer.decode([t], skip_special_tokens=False): finite_logprob(lp) for t, lp in entry.top})
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}

    def chunk(self, choice: Choice, delta: StreamDelta) -> dict | None:
        text = delta.text
        if choice.index not in self._echoed:
            self._echoed.add(choice.index)
            text = self._prefix(choice) + text
        if not text and not delta.finish_reason and not delta.token_ids:
            return None
        offset = len(choice.text) - len(delta.text)
        logprobs = self._logprobs(delta.logprobs or [], offset)
        return {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(choice)}

    def whole(self, choice: Choice) -> dict:
        prefix = self._prefix(choice)
        logprobs = self._logprobs(choice.logprobs, len(prefix))
        return {"index": choice.index, "text": prefix + choice.text, "logprobs": logprobs, "finish_reason": finish_reason(choice)}


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
            {"index": index, "delta": {"role": "assistant", "content": content}, "logprobs": None, "finish_reason": None}
            for index in range(len(self.generation.choices))
        ]

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": text, "logprob": finite_logprob(logprob), "bytes": list(text.encode())}

    def _logprobs(self, entries: list[TokenLogprobs]) -> dict | None:
        if not self.body.logprobs:
            return None
        return {"content": [{**self._entry(e.token_id, e.logprob), "top_logprobs": [self._entry(t, lp) for t, lp in e.top]} for e in entries]}

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
            parser = self._parsers.setdefault(choice.index, ToolCallParser(self.tools.names, incremental=self.tools.is_forced))
            pieces = parser.feed(delta.text) + (parser.finish() if delta.finish_reason else [])
            message, num_calls, is_cut = _stream_delta(pieces), parser.num_calls, parser.is_cut
            if not message and not delta.finish_reason and not self.body.logprobs:
                return None  # held back: part of a tag, or arguments that may end the call
        return {
            "index": choice.index, "delta": message, "logprobs": self._logprobs(delta.logprobs or []),
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
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}} for call in calls
            ]
        return {
            "index": choice.index, "message": message, "logprobs": self._logprobs(choice.logprobs),
            "finish_reason": self._finish_reason(choice, len(calls), is_cut),
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
