"""A deterministic stand-in for a model, for fast engine and scheduler tests.

It keeps a real paged "KV cache" (one int per slot: the token written
there) and derives each next token from the tokens it reads back through
the block table. Wrong block tables, a shared block overwritten or a
token computed at the wrong position therefore change its output, which
is what makes it useful for testing paging and scheduling: for the same
tokens it always answers the same, however the batch is composed. It is
not a language model.

It honours what a request wants of its next token as far as a stand-in
can: the hash picks among the structured-output ``allowed_tokens`` only,
a ``logit_bias`` of -100 bans a token and one of +100 forces it (other
biases cannot move an arbitrary choice), and its end-of-sequence draw is
taken only when the mask allows EOS. Its distribution puts the token it
would pick at probability 1/2 and the following token ids at 1/4, 1/8, ...,
and it scores prompt tokens against that distribution. It verifies a
speculator's proposals: each kept while it equals the token it would pick
after the tokens before it.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

import attrs
import numpy as np

from hetero_core.batch import ExecutionBatch, ExecutionOutput, ScheduledSequence, TokenLogprobs
from hetero_core.errors import ConfigError, ExecutionError
from hetero_core.protocols import ModelInfo
from hetero_core.step_layout import layout, slots
from hetero_core.structured_output import allowed_token_ids
from hetero_core.validators import number_in

SLOT_BYTES = 8


@attrs.frozen
class MockExecutorOptions:
    """The ``mock`` executor's options (see :class:`MockExecutor`)."""

    vocab_size: int = attrs.field(default=259, validator=number_in(1, 2**31 - 1, integer=True, error=ConfigError))
    eos_token_id: int = attrs.field(default=257, validator=number_in(0, 2**31 - 1, integer=True, error=ConfigError))
    eos_probability: float = attrs.field(default=0.0, validator=number_in(0.0, 1.0, error=ConfigError))
    max_model_len: int = attrs.field(
        default=1 << 20, validator=number_in(1, 2**31 - 1, integer=True, error=ConfigError)
    )
    step_latency: float = attrs.field(default=0.0, validator=number_in(0.0, 60.0, error=ConfigError))


class MockExecutor:
    """Next token = a hash of the cached tokens, in ``[0, vocab_size)``.

    ``config`` (the engine's, when built as a component) is not needed.

    :param vocab_size: tokens it may produce (defaults to the simple tokenizer's).
    :param eos_token_id: the token it emits with probability ``eos_probability``.
    :param max_model_len: the context length it reports.
    :param step_latency: seconds each ``execute`` takes, to stand in for compute time.
    """

    verifies_proposals = True

    def __init__(
        self,
        config: Any = None,
        *,
        vocab_size: int = 259,
        eos_token_id: int = 257,
        eos_probability: float = 0.0,
        max_model_len: int = 1 << 20,
        step_latency: float = 0.0,
    ) -> None:
        eos_token_ids = (eos_token_id,) if eos_token_id < vocab_size else ()  # one it can never draw does not count
        self._info = ModelInfo(
            name="mock", vocab_size=vocab_size, max_model_len=max_model_len, eos_token_ids=eos_token_ids
        )
        self._eos_token_id = eos_token_id
        self._eos_threshold = int(eos_probability * 2**32)
        self._step_latency = step_latency
        self._slots = np.empty(0, dtype=np.int64)
        self._block_size = 0

    @property
    def model_info(self) -> ModelInfo:
        return self._info

    def kv_cache_block_bytes(self, block_size: int) -> int:
        return block_size * SLOT_BYTES

    def initialize_cache(self, num_blocks: int, block_size: int) -> None:
        self._slots = np.full(num_blocks * block_size, -1, dtype=np.int64)
        self._block_size = block_size

    def warm_up(self, max_num_tokens: int, max_num_seqs: int) -> None:
        pass

    def execute(self, batch: ExecutionBatch) -> ExecutionOutput:
        size = self._block_size
        if batch.block_size != size:
            raise ExecutionError(f"batch block_size {batch.block_size} != cache block_size {size}")
        step = layout(batch)
        self._slots[step.slot_mapping] = step.input_ids
        sampled: dict[int, int] = {}
        logprobs: dict[int, TokenLogprobs] = {}
        prompt_logprobs: dict[int, list[TokenLogprobs]] = {}
        num_accepted: dict[int, int] = {}
        accepted_logprobs: dict[int, list[TokenLogprobs]] = {}
        for seq in batch.sequences:
            positions = seq.prompt_logprob_positions
            if not seq.do_sample and not positions:
                continue
            num_tokens = seq.start_position + len(seq.token_ids)
            context = self._slots[slots(seq.block_table, np.arange(num_tokens), size)].tolist()
            if positions:
                prompt_logprobs[seq.seq_id] = [
                    self._prompt_logprob(context[:p], seq.all_token_ids[p], seq.params.prompt_logprobs)
                    for p in positions
                ]
            if not seq.do_sample:
                continue
            tokens, entries = self._verify(seq, context)
            sampled[seq.seq_id] = tokens[-1]
            if seq.params.logprobs is not None:
                logprobs[seq.seq_id] = entries[-1]
            if seq.num_proposed:
                num_accepted[seq.seq_id] = len(tokens) - 1
                if seq.params.logprobs is not None:
                    accepted_logprobs[seq.seq_id] = entries[:-1]
        if self._step_latency:
            time.sleep(self._step_latency)
        return ExecutionOutput(
            sampled,
            logprobs,
            prompt_logprobs=prompt_logprobs,
            num_accepted=num_accepted,
            accepted_logprobs=accepted_logprobs,
        )

    def close(self) -> None:
        self._slots = np.empty(0, dtype=np.int64)

    def _next_token(self, context: list[int], seed: int | None, candidates: list[int] | None) -> int:
        digest = hashlib.blake2b(repr((context, seed)).encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        wants_eos = value & 0xFFFFFFFF < self._eos_threshold
        if candidates is None:
            return self._eos_token_id if wants_eos else (value >> 32) % self._info.vocab_size
        if wants_eos and self._eos_token_id in candidates:
            return self._eos_token_id
        return candidates[(value >> 32) % len(candidates)] if candidates else 0

    def _verify(self, seq: ScheduledSequence, context: list[int]) -> tuple[list[int], list[TokenLogprobs]]:
        """The tokens picked at the sequence's last position and after each kept proposal, with their logprobs
        (where asked): the last is the one after the kept proposals."""
        proposed = seq.proposed_token_ids
        first = len(context) - len(proposed)
        tokens, entries = [], []
        for j in range(len(proposed) + 1):
            candidates = self._candidates(seq, j)
            token_id = self._next_token(context[: first + j], seq.seed, candidates)
            tokens.append(token_id)
            if seq.params.logprobs is not None:
                entries.append(self._logprobs(token_id, seq.params.logprobs, candidates))
            if j == len(proposed) or token_id != proposed[j]:
                break
        return tokens, entries

    def _candidates(self, seq: ScheduledSequence, position: int = 0) -> list[int] | None:
        """The tokens the sequence may take at its ``position``-th sampled position, ascending; None when it may
        take any."""
        bias = dict(seq.params.logit_bias)
        if seq.allowed_tokens is None and not bias:
            return None
        vocab_size = self._info.vocab_size
        if seq.allowed_tokens is None:
            candidates = list(range(vocab_size))
        else:
            rows = seq.num_proposed + 1 if seq.num_proposed else None  # the batch's contract: a row, or one a position
            if (seq.allowed_tokens.shape[0] if seq.allowed_tokens.ndim == 2 else None) != rows:
                raise ValueError(f"allowed_tokens of shape {seq.allowed_tokens.shape} for {seq.num_proposed} proposals")
            mask = seq.allowed_tokens if rows is None else seq.allowed_tokens[position]
            candidates = allowed_token_ids(mask, vocab_size).tolist()
        forced = [t for t in candidates if bias.get(t, 0.0) >= 100.0]
        return forced or [t for t in candidates if bias.get(t, 0.0) > -100.0]

    def _prompt_logprob(self, context: list[int], token_id: int, num_top: int) -> TokenLogprobs:
        """``token_id`` in the unconstrained, unseeded distribution that follows ``context``."""
        greedy = self._next_token(context, None, None)
        distance = (token_id - greedy) % self._info.vocab_size
        entry = self._logprobs(greedy, num_top, None)
        return TokenLogprobs(token_id, math.log(0.5) * (distance + 1), entry.top, rank=distance + 1)

    def _logprobs(self, token_id: int, num_top: int, candidates: list[int] | None) -> TokenLogprobs:
        """The sampled token at probability 1/2, then the next tokens it may take at 1/4, 1/8, ..."""
        if candidates is None:
            following = [(token_id + k) % self._info.vocab_size for k in range(num_top)]
        else:
            start = candidates.index(token_id) if token_id in candidates else 0
            following = [token_id, *(candidates[start + 1 :] + candidates[:start])][:num_top]
        top = [(t, math.log(0.5) * (k + 1)) for k, t in enumerate(following)]
        return TokenLogprobs(token_id, math.log(0.5), top)
