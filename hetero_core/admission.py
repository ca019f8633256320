"""What a request must satisfy before it is queued: arguments of the right types, and a fit in the engine.

Every check here runs in the submitting thread, before the request touches
the engine's state, so a rejected request leaves nothing behind. Each
failure is a ``ValidationError`` (or ``CacheMemoryError``) naming the
argument or parameter at fault.
"""

from __future__ import annotations

import math
from typing import Any
from typing import Sequence as SequenceOf

from hetero_core.config import EngineConfig
from hetero_core.errors import CacheMemoryError, ValidationError
from hetero_core.params import GenerationParams


class Admission:
    """The limits one engine sets on requests: its model's vocabulary and context, its pool and budgets."""

    def __init__(self, config: EngineConfig, vocab_size: int, max_model_len: int, num_blocks: int) -> None:
        self.config = config
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.num_blocks = num_blocks

    def check_arguments(self, params: Any, request_id: Any, on_output: Any) -> GenerationParams:
        """The arguments every submission takes, checked; the params to use."""
        if params is None:
            params = GenerationParams()
        elif not isinstance(params, GenerationParams):
            raise ValidationError(
                f"params must be a GenerationParams (GenerationParams.from_mapping builds one from a dict),"
                f" got {type(params).__name__}",
                param="params",
            )
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise ValidationError(f"request_id must be a non-empty string, got {request_id!r}", param="request_id")
        if on_output is not None and not callable(on_output):
            raise ValidationError(f"on_output must be callable, got {type(on_output).__name__}", param="on_output")
        if params.top_k is not None and params.top_k > self.vocab_size:
            raise ValidationError(
                f"top_k must be at most the vocabulary size {self.vocab_size}, got {params.top_k}", param="top_k"
            )
        beyond = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if beyond:
            raise ValidationError(
                f"stop_token_ids must be below the vocabulary size {self.vocab_size}, got {beyond[0]}",
                param="stop_token_ids",
            )
        biased = [t for t, _ in params.logit_bias if t >= self.vocab_size]
        if biased:
            raise ValidationError(
                f"logit_bias token ids must be below the vocabulary size {self.vocab_size}, got {biased[0]}",
                param="logit_bias",
            )
        return params

    def check_token_ids(self, token_ids: SequenceOf[Any]) -> list[int]:
        """A prompt given as token ids: ints in the model's vocabulary."""
        for token_id in token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
                raise ValidationError(
                    f"prompt token ids must be integers in [0, {self.vocab_size}), got {token_id!r}", param="prompt"
                )
        return list(token_ids)

    def check_fits(self, token_ids: list[int], params: GenerationParams) -> None:
        """The request can run to completion in this engine: context, pool, step budget, samples."""
        num_prompt = len(token_ids)
        if num_prompt == 0:
            raise ValidationError("prompt must not be empty", param="prompt")
        if max(token_ids) >= self.vocab_size:
            raise ValidationError(
                f"the prompt encodes to token {max(token_ids)}, beyond the model's vocabulary of"
                f" {self.vocab_size}: the tokenizer does not match the model",
                param="prompt",
            )
        if num_prompt + params.max_tokens > self.max_model_len:
            raise ValidationError(
                f"prompt has {num_prompt} tokens and max_tokens is {params.max_tokens}: together they exceed"
                f" the maximum context length of {self.max_model_len} tokens",
                param="max_tokens" if num_prompt < self.max_model_len else "prompt",
            )
        blocks_needed = math.ceil((num_prompt + params.max_tokens) / self.config.block_size)
        if blocks_needed > self.num_blocks:
            raise CacheMemoryError(
                f"request needs {blocks_needed} KV blocks but the pool has only {self.num_blocks}", param="max_tokens"
            )
        if not self.config.enable_chunked_prefill and num_prompt > self.config.max_total_tokens:
            raise ValidationError(
                f"prompt has {num_prompt} tokens, more than max_total_tokens={self.config.max_total_tokens}"
                " and chunked prefill is disabled",
                param="prompt",
            )
        if params.n > self.config.max_num_seqs:
            raise ValidationError(
                f"n must be at most max_num_seqs={self.config.max_num_seqs}, got {params.n}", param="n"
            )
