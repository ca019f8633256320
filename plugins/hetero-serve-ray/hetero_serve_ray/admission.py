"""The engine's input checks, answered by the front end so that bad input gets its 400 before it is routed.

A replica checks every request again (it is the authority); what only it
can refuse, a full waiting queue, reaches the client as a 503 naming the
reason. The limits come from the first replica that reports ready.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import attrs

from hetero_core.config import EngineConfig
from hetero_core.errors import CacheMemoryError, ValidationError
from hetero_core.params import GenerationParams


@attrs.frozen
class Limits:
    """What a replica's engine admits."""

    max_model_len: int
    num_blocks: int
    vocab_size: int
    block_size: int
    max_num_seqs: int
    max_total_tokens: int
    enable_chunked_prefill: bool

    @classmethod
    def of(cls, config: EngineConfig, reported: dict[str, Any]) -> Limits:
        """``reported``: the replica's ``max_model_len``, ``num_blocks`` and ``vocab_size``."""
        return cls(
            reported["max_model_len"],
            reported["num_blocks"],
            reported["vocab_size"],
            config.block_size,
            config.max_num_seqs,
            config.max_total_tokens,
            config.enable_chunked_prefill,
        )

    def check(self, token_ids: Sequence[int], is_text: bool, params: GenerationParams) -> None:
        """Raise the engine's error for a request it would refuse whatever its load."""
        num_prompt = len(token_ids)
        if num_prompt == 0:
            raise ValidationError("prompt must not be empty", param="prompt")
        if not is_text:
            for token_id in token_ids:
                if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
                    raise ValidationError(
                        f"prompt token ids must be integers in [0, {self.vocab_size}), got {token_id!r}", param="prompt"
                    )
        if num_prompt + params.max_tokens > self.max_model_len:
            raise ValidationError(
                f"prompt has {num_prompt} tokens and max_tokens is {params.max_tokens}: together they exceed"
                f" the maximum context length of {self.max_model_len} tokens",
                param="max_tokens" if num_prompt < self.max_model_len else "prompt",
            )
        blocks_needed = math.ceil((num_prompt + params.max_tokens) / self.block_size)
        if blocks_needed > self.num_blocks:
            raise CacheMemoryError(
                f"request needs {blocks_needed} KV blocks but the pool has only {self.num_blocks}", param="max_tokens"
            )
        if not self.enable_chunked_prefill and num_prompt > self.max_total_tokens:
            raise ValidationError(
                f"prompt has {num_prompt} tokens, more than max_total_tokens={self.max_total_tokens} and chunked "
                "prefill is disabled",
                param="prompt",
            )
        if params.n > self.max_num_seqs:
            raise ValidationError(f"n must be at most max_num_seqs={self.max_num_seqs}, got {params.n}", param="n")
