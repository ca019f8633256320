"""What crosses the executor boundary each step: the batch in, the sampled tokens out.

These classes are built once per step per sequence, so they are plain
``attrs.define`` classes (cheap to create), not frozen ones. Executors must
treat every field as read-only.
"""

from __future__ import annotations

from typing import Any

import attrs

from hetero_core.params import GenerationParams


@attrs.define
class ScheduledSequence:
    """One sequence's share of a step.

    The executor computes ``token_ids`` at positions ``start_position``,
    ``start_position + 1``, ... and writes their keys and values into the
    cache slots given by ``block_table``: the token at position ``p`` goes
    to slot ``block_table[p // block_size] * block_size + p % block_size``.
    The tokens before ``start_position`` are already in the cache (attention
    must read them through the same block table). When ``do_sample`` is set,
    the executor samples the token that follows the last of ``token_ids``
    and returns it; otherwise (a prefill chunk that is not the prompt's last)
    it returns nothing for this sequence.

    The executor applies what the request wants of its next token: the
    ``allowed_tokens`` bitmask (structured output; a token outside it must
    never be sampled) and ``params.logit_bias`` (added to the logits before
    penalties and sampling), besides the sampling parameters.

    When ``params.prompt_logprobs`` is set, the executor also scores the
    prompt: see :attr:`prompt_logprob_positions` and
    :class:`ExecutionOutput`.

    **Proposals.** When ``num_proposed`` is above 0 (a decode step of a
    speculator's sequence; only for executors with ``verifies_proposals``),
    the last ``num_proposed`` of ``token_ids`` are guesses of the tokens that
    follow, not yet part of the sequence (:attr:`proposed_token_ids`). The
    executor samples at each of the last ``num_proposed + 1`` positions
    exactly as plain decoding would sample there, had the proposals before
    that position been sampled (penalties, ``min_tokens`` and a seed's
    position count them; ``allowed_tokens`` then holds one row per
    position). It keeps the proposals while each equals the token sampled
    at its position, and returns how many it kept in
    ``ExecutionOutput.num_accepted`` and the token sampled after the last
    kept one in ``sampled_token_ids``. A proposal is a point mass, so this is
    exact rejection sampling: a proposal is kept with the probability the
    model gives it, and otherwise the token comes from the model's
    distribution without it; the tokens, seeded or not, are distributed as
    plain decoding's.
    """

    seq_id: int
    token_ids: list[int]  # the tokens to compute this step: a prefill chunk, or one token in decode
    start_position: int  # how many of the sequence's tokens are already in the KV cache
    block_table: list[int]  # physical block ids, logical order; covers every position up to the last token
    do_sample: bool
    params: GenerationParams
    all_token_ids: list[int]  # the whole sequence so far (prompt then output), for penalties; read-only
    num_prompt_tokens: int
    seed: int | None  # per-sample seed; with it, the token at a given position must not depend on batching
    allowed_tokens: Any = (
        None  # numpy int32 bitmask row (hetero_core.structured_output) of the tokens it may take; None: all
    )
    num_proposed: int = 0  # the last this many of token_ids are proposals to verify

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def proposed_token_ids(self) -> list[int]:
        return self.token_ids[len(self.token_ids) - self.num_proposed :]

    @property
    def prompt_logprob_positions(self) -> range:
        """The positions whose prompt token this step scores: each one after a position computed this step,
        while still in the prompt. Empty unless ``params.prompt_logprobs`` is set."""
        if self.params.prompt_logprobs is None:
            return range(0)
        return range(
            self.start_position + 1, min(self.start_position + len(self.token_ids), self.num_prompt_tokens - 1) + 1
        )


@attrs.define
class ExecutionBatch:
    """Everything the executor needs for one forward pass over a mixed prefill/decode batch."""

    sequences: list[ScheduledSequence]
    block_size: int


@attrs.define
class TokenLogprobs:
    """The log-probability of a sampled token and of the most likely alternatives.

    ``top`` lists (token_id, logprob) pairs in descending order of logprob;
    it has ``params.logprobs`` entries. Logprobs are of the distribution the
    model produced (after penalties, before temperature and truncation).
    Every logprob is a finite number at most 0 (an executor reports a
    token of probability zero with a large negative value, e.g. -9999.0).
    ``rank`` (prompt logprobs only) is 1 + how many tokens are more likely.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = attrs.field(factory=list)
    rank: int | None = None


@attrs.define
class ExecutionOutput:
    """The result of one batch, per sequence with ``do_sample`` set: a sampled token, or an error.

    A sequence the executor cannot handle (its parameters overflow the
    sampler, its logits are not finite, ...) goes in ``errors`` with a short
    reason, instead of a token; the engine fails that sequence's request
    alone and the rest of the batch proceeds. Raising from ``execute`` fails
    the whole batch instead. The reason is shown to the request's client:
    describe the problem, not the internals (no tracebacks, no paths).

    ``prompt_logprobs`` scores the prompt for every sequence whose
    ``params.prompt_logprobs`` is set and whose
    :attr:`ScheduledSequence.prompt_logprob_positions` is not empty: one
    :class:`TokenLogprobs` per position, in order, for the prompt token at
    that position given the tokens before it, from the model's raw
    distribution (no penalties, bias, mask or temperature), with ``top``
    holding ``params.prompt_logprobs`` entries and ``rank`` set. A prefill
    split into chunks gets them chunk by chunk, and the engine joins them;
    the sequence's ``do_sample`` does not matter.

    A sequence with proposals (:attr:`ScheduledSequence.num_proposed`) also
    has ``num_accepted`` (how many proposals were kept, from 0 to
    ``num_proposed``) and, where ``params.logprobs`` is set,
    ``accepted_logprobs``: one :class:`TokenLogprobs` per kept proposal, in
    order; ``sampled_token_ids`` and ``logprobs`` are of the token after them.
    """

    sampled_token_ids: dict[int, int]  # seq_id -> next token id
    logprobs: dict[int, TokenLogprobs] = attrs.field(factory=dict)  # only for sequences that asked
    errors: dict[int, str] = attrs.field(factory=dict)  # seq_id -> why no token could be produced
    prompt_logprobs: dict[int, list[TokenLogprobs]] = attrs.field(
        factory=dict
    )  # seq_id -> one per scored prompt position
    num_accepted: dict[int, int] = attrs.field(factory=dict)  # seq_id -> proposals kept
    accepted_logprobs: dict[int, list[TokenLogprobs]] = attrs.field(factory=dict)  # seq_id -> one per kept proposal
