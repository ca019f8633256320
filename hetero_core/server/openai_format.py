"""Shaping results as OpenAI's response and stream-chunk objects."""

from __future__ import annotations

import json
import time
from typing import Any

from hetero_core.batch import TokenLogprobs
from hetero_core.server.generation import Choice


def sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def finish_reason(choice: Choice) -> str | None:
    return None if choice.finish_reason is None else choice.finish_reason.value


def completion_logprobs(tokenizer: Any, logprobs: list[TokenLogprobs], text_offset: int) -> dict[str, Any]:
    """The completions API's logprobs object (tokens, token_logprobs, top_logprobs, text_offset)."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = text_offset
    for entry in logprobs:
        text = tokenizer.decode([entry.token_id], skip_special_tokens=False)
        tokens.append(text)
        token_logprobs.append(entry.logprob)
        top.append({tokenizer.decode([t], skip_special_tokens=False): lp for t, lp in entry.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def chat_logprobs(tokenizer: Any, logprobs: list[TokenLogprobs]) -> dict[str, Any]:
    """The chat API's logprobs object: one entry per token with its top alternatives."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(e.token_id, e.logprob), "top_logprobs": [entry(t, lp) for t, lp in e.top]} for e in logprobs]}


def envelope(kind: str, request_id: str, model: str, choices: list[dict], usage: dict | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": request_id, "object": kind, "created": int(time.time()), "model": model, "choices": choices}
    if usage is not None or kind in ("text_completion", "chat.completion"):
        body["usage"] = usage
    return body
