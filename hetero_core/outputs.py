"""What the engine hands back: streamed deltas while generating, a record when done."""

from __future__ import annotations

import attrs

from hetero_core.batch import TokenLogprobs
from hetero_core.sequence import FinishReason


@attrs.define
class StreamDelta:
    """New output of one sample of one request, produced by one engine step.

    ``text`` is only ever whole characters: the detokenizer holds back the
    bytes of a character split across tokens. The final delta of a sample
    carries its ``finish_reason``; it may have empty text. When the request
    asked for ``prompt_logprobs``, the first delta of the request (of any
    sample) carries them: one entry per prompt token, the first ``None``.
    """

    request_id: str
    index: int  # which of the request's n samples
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    error: str | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


@attrs.frozen
class SequenceOutput:
    """The full output of one sample."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    logprobs: list[TokenLogprobs] | None = None


@attrs.frozen
class CompletedRequest:
    """A finished request. ``output_text`` and ``generated_tokens`` are sample 0's; ``outputs`` has all n.

    ``prompt_logprobs`` (when the request asked and its prompt was scored):
    one entry per input token, the first ``None``.
    """

    request_id: str
    input_text: str
    output_text: str
    input_tokens: list[int]
    generated_tokens: list[int]
    duration: float  # seconds from submission to the last token
    finish_reason: FinishReason
    outputs: list[SequenceOutput]
    time_to_first_token: float | None = None  # seconds from submission to the first output token
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
