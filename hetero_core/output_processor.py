"""After a step: append sampled tokens, detokenize, check stop conditions, stream deltas.

Stop strings are matched on the detokenized text. While a request has stop
strings, the last ``max(len(stop)) - 1`` characters are held back from the
stream, so a client never receives text that a stop string later removes.
The text ends before the stop string, or after it with
``include_stop_str_in_output``.

Prompt logprobs arrive from the executor chunk by chunk; they are joined in
position order, and a chunk computed again (after a preemption) adds none
twice.
"""

from __future__ import annotations

import time

from hetero_core.batch import TokenLogprobs
from hetero_core.outputs import CompletedRequest, SequenceOutput, StreamDelta
from hetero_core.protocols import Tokenizer
from hetero_core.sequence import FinishReason, Request, Sequence


class OutputProcessor:
    """Turns sampled tokens into text, finish reasons and stream deltas."""

    def __init__(self, tokenizer: Tokenizer, max_model_len: int, eos_token_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids  # end generation unless a request ignores EOS

    def append_token(
        self, seq: Sequence, token_id: int, logprobs: TokenLogprobs | None, *, is_complete: bool = False
    ) -> None:
        """Add one sampled token; finishes the sequence when a stop condition holds.

        ``is_complete``: the sample's structured output is complete, so it
        stops here whatever ``min_tokens`` and ``ignore_eos`` say.
        """
        request = seq.request
        params = request.params
        if seq.detokenizer is None:
            seq.detokenizer = self.tokenizer.new_detokenizer(
                seq.prompt_token_ids, skip_special_tokens=params.skip_special_tokens
            )
        seq.append_token(token_id)
        if logprobs is not None:
            seq.logprobs.append(logprobs)
        if request.first_token_time is None:
            request.first_token_time = time.monotonic()
        num_output = seq.num_output_tokens
        may_stop = num_output >= params.min_tokens
        is_stop_token = may_stop and (
            (token_id in self.eos_token_ids and not params.ignore_eos) or token_id in params.stop_token_ids
        )
        if not is_stop_token:
            text_before = len(seq.output_text)
            seq.output_text += seq.detokenizer.add((token_id,))
            if params.stop and may_stop and self._truncate_at_stop(seq, text_before):
                seq.finish(FinishReason.STOP)
                return
        if is_stop_token or is_complete:
            reason = FinishReason.STOP
        elif num_output >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = FinishReason.LENGTH
        else:
            return
        seq.output_text += seq.detokenizer.finish()
        seq.finish(reason)

    @staticmethod
    def _truncate_at_stop(seq: Sequence, text_before: int) -> bool:
        """Cut the text at the first stop string that the newest text completes (after it, if it is kept)."""
        params = seq.request.params
        search_from = max(0, text_before - max(len(s) for s in params.stop) + 1)
        hits = [(i, -len(s)) for i, s in ((seq.output_text.find(s, search_from), s) for s in params.stop) if i >= 0]
        if not hits:
            return False
        start, minus_length = min(hits)  # the earliest stop string; of those starting there, the longest
        seq.output_text = seq.output_text[: start - minus_length if params.include_stop_str_in_output else start]
        return True

    @staticmethod
    def add_prompt_logprobs(request: Request, start_position: int, entries: list[TokenLogprobs]) -> None:
        """Join the prompt logprobs of a step that computed from ``start_position`` (a prefix of its own, if any)."""
        # entries[i] scores position start_position + 1 + i; request.prompt_logprobs holds positions 1, 2, ...
        # A sequence that scores its prompt never starts past what is held (it takes nothing from the prefix cache).
        request.prompt_logprobs.extend(entries[len(request.prompt_logprobs) - start_position :])

    def delta(self, seq: Sequence, num_new_tokens: int, num_new_logprobs: int) -> StreamDelta:
        """The stream delta for what the sequence produced this step (updates what was emitted)."""
        params = seq.request.params
        end = len(seq.output_text)
        if params.stop and seq.finish_reason is None:
            end = max(seq.num_emitted_chars, end - (max(len(s) for s in params.stop) - 1))
        text = seq.output_text[seq.num_emitted_chars : end]
        seq.num_emitted_chars = end
        request = seq.request
        prompt_logprobs = None
        if request.has_prompt_logprobs and not request.is_prompt_logprobs_sent:
            request.is_prompt_logprobs_sent = True
            prompt_logprobs = [None, *request.prompt_logprobs]
        return StreamDelta(
            request_id=seq.request.request_id,
            index=seq.index,
            text=text,
            token_ids=seq.token_ids[len(seq.token_ids) - num_new_tokens :] if num_new_tokens else [],
            logprobs=seq.logprobs[len(seq.logprobs) - num_new_logprobs :] if num_new_logprobs else None,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            error=seq.request.error if seq.finish_reason is FinishReason.ERROR else None,
            prompt_logprobs=prompt_logprobs,
        )


def completed_request(request: Request) -> CompletedRequest:
    """The record of a finished request (all its samples)."""
    outputs = [
        SequenceOutput(
            index=seq.index,
            text=seq.output_text,
            token_ids=seq.output_token_ids,
            finish_reason=seq.finish_reason or FinishReason.ABORT,
            logprobs=seq.logprobs if request.params.logprobs is not None else None,
        )
        for seq in sorted(request.sequences, key=lambda s: s.index)
    ]
    finish_time = request.finish_time or time.monotonic()
    first = outputs[0]
    return CompletedRequest(
        request_id=request.request_id,
        input_text=request.prompt_text,
        output_text=first.text,
        input_tokens=request.prompt_token_ids,
        generated_tokens=first.token_ids,
        duration=finish_time - request.arrival_time,
        finish_reason=first.finish_reason,
        outputs=outputs,
        time_to_first_token=None
        if request.first_token_time is None
        else request.first_token_time - request.arrival_time,
        num_cached_tokens=request.sequences[0].num_cached_tokens,
        error=request.error,
        prompt_logprobs=[None, *request.prompt_logprobs] if request.has_prompt_logprobs else None,
    )
