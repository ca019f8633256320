"""Requests and the sequences they generate: the engine's mutable per-request state."""

from __future__ import annotations

import enum
from typing import Any, Callable

import attrs

from hetero_core.params import GenerationParams


class RequestState(enum.Enum):
    """Where a request or one of its sequences is in its life.

    PENDING: waiting for admission (also after a preemption).
    PREFILL: admitted; its known tokens are being computed, possibly in chunks.
    DECODE: generating one token per step.
    COMPLETED: finished normally (stop, length or abort).
    FAILED: finished with an error; ``Request.error`` holds the reason.
    """

    PENDING = "pending"
    PREFILL = "prefill"
    DECODE = "decode"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def is_finished(self) -> bool:
        return self in (RequestState.COMPLETED, RequestState.FAILED)


class FinishReason(str, enum.Enum):
    """Why a sequence stopped; the values are OpenAI's ``finish_reason`` strings."""

    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # cancelled by the caller
    ERROR = "error"  # the executor failed


@attrs.define(eq=False)
class Sequence:
    """One token stream: the prompt followed by what has been generated so far.

    A request has one sequence per parallel sample (``n``). The scheduler
    places sequences, not requests: each has its own block table, the
    siblings sharing the prompt's full blocks.
    ``num_computed_tokens`` counts the tokens whose KV is in the cache;
    the tokens from there up to ``len(token_ids)`` still need computing.
    """

    seq_id: int
    request: Request
    index: int  # which of the request's n samples this is
    token_ids: list[int]
    num_prompt_tokens: int
    state: RequestState = RequestState.PENDING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    finish_reason: FinishReason | None = None
    output_text: str = ""
    num_emitted_chars: int = 0  # how much of output_text has been streamed
    logprobs: list[Any] = attrs.field(factory=list)
    detokenizer: Any = None  # made on the first sampled token
    num_preemptions: int = 0
    matcher: Any = None  # the sample's GrammarMatcher under structured output, made on its first sampled token

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def is_finished(self) -> bool:
        return self.state.is_finished

    @property
    def sampling_seed(self) -> int | None:
        """The seed for this sample, distinct per sample of a seeded request."""
        seed = self.request.params.seed
        return None if seed is None else (seed + self.index * 0x9E3779B1) % 2**63

    # The transitions below are the only writers of ``state``, ``num_computed_tokens`` and ``finish_reason``.

    def admit(self, num_cached_tokens: int) -> None:
        """Placed in the cache, whose prefix cache already holds its first ``num_cached_tokens`` tokens."""
        if self.num_preemptions == 0:
            self.num_cached_tokens = num_cached_tokens
        self.num_computed_tokens = num_cached_tokens
        self.state = RequestState.PREFILL

    def preempt(self) -> None:
        """Its blocks were taken back: it waits again, to be recomputed from its first token."""
        self.num_computed_tokens = 0
        self.state = RequestState.PENDING
        self.num_preemptions += 1

    def advance(self, num_tokens: int) -> None:
        """``num_tokens`` more of its tokens are now in the KV cache."""
        self.num_computed_tokens += num_tokens

    def append_token(self, token_id: int) -> None:
        """A sampled token joins the sequence: from now on it decodes."""
        self.token_ids.append(token_id)
        self.state = RequestState.DECODE

    def finish(self, reason: FinishReason) -> None:
        """It stops for ``reason``; an error fails it."""
        self.finish_reason = reason
        self.state = RequestState.FAILED if reason is FinishReason.ERROR else RequestState.COMPLETED


@attrs.define(eq=False)
class Request:
    """A prompt submitted to the engine, everything it has produced, and the owner of its ``n`` samples.

    The request makes its ``n`` samples when it is taken in: sibling
    sequences of the same prompt. The first computes the prompt's full
    blocks; the others are held (:attr:`held_samples`) until it has, then
    share those blocks and each computes only the prompt's last block
    itself (see :mod:`hetero_core.scheduler`).
    """

    request_id: str
    prompt_text: str
    prompt_token_ids: list[int]
    params: GenerationParams
    arrival_index: int  # monotonic submission order; ties in time never reorder requests
    arrival_time: float
    on_output: Callable[[Any], None] | None = None
    grammar: Any = None  # the compiled params.structured_output; each sample makes its own matcher from it
    sequences: list[Sequence] = attrs.field(factory=list)
    held_samples: list[Sequence] = attrs.field(factory=list)  # siblings waiting for the first sample's prompt blocks
    prompt_logprobs: list[Any] = attrs.field(factory=list)  # TokenLogprobs of prompt tokens 1, 2, ... as computed
    is_prompt_logprobs_sent: bool = False  # streamed with the request's first delta
    error: str | None = None
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def priority(self) -> int:
        return self.params.priority

    @property
    def has_prompt_logprobs(self) -> bool:
        """Every prompt token after the first is scored (never true when the request did not ask)."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) == len(self.prompt_token_ids) - 1

    @property
    def is_finished(self) -> bool:
        """Every sample finished."""
        return bool(self.sequences) and all(s.is_finished for s in self.sequences)

    def start(self, next_seq_id: Callable[[], int]) -> Sequence:
        """Make the ``n`` samples; return the first, which computes the prompt's full blocks for all of them."""
        for _ in range(self.params.n):
            seq = Sequence(
                next_seq_id(), self, len(self.sequences), list(self.prompt_token_ids), len(self.prompt_token_ids)
            )
            self.sequences.append(seq)
        self.held_samples = self.sequences[1:]
        return self.sequences[0]

    def end(self, reason: FinishReason) -> list[Sequence]:
        """Finish every unfinished sample, held ones included, with ``reason`` (an abort or an error); return them."""
        self.held_samples = []
        ended = [seq for seq in self.sequences if not seq.is_finished]
        for seq in ended:
            seq.finish(reason)
        return ended
