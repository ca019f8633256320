"""Speculative decoding: a speculator guesses the next tokens, the executor checks them all in one step.

A *speculator* (a plugin, see ``register_speculators``; config key
``speculator``) proposes up to a given number of tokens for each decoding
sequence, from the sequence's tokens and its own state: prompt lookup, a
smaller draft model, anything. The proposals ride in the step's batch
(:attr:`~hetero_core.batch.ScheduledSequence.num_proposed`); the executor
computes them with the sequence's next token, samples at every position as
plain decoding would, and keeps the proposals up to the first that differs
from what it sampled. Each step of a sequence therefore yields from 1 to
``1 + proposals`` tokens, distributed exactly as plain decoding's.

The engine asks for proposals before it schedules a step; the scheduler
cuts them to the step's token budget, a request's ``max_tokens`` and the
context, and drops them rather than preempt anyone for their slots. Slots
of rejected proposals are released after the step (``CacheAllocator.trim``)
and never enter the prefix cache, which seals only computed tokens.

A speculator's fault is its own: one that raises, or returns something
other than lists of vocabulary ids no longer than asked, is logged with its
plugin's name and turned off for the engine's life; decoding goes on plain.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable
from typing import Sequence as SequenceOf

import attrs

from hetero_core.logs import get_logger

log = get_logger(__name__)


@attrs.define
class ProposalRequest:
    """One decoding sequence, as a speculator sees it. Read-only."""

    seq_id: int
    token_ids: list[int]  # the prompt, then the output so far (a copy); the proposals follow the last
    num_prompt_tokens: int
    max_proposals: int  # propose at most this many (always at least 1)


@runtime_checkable
class Speculator(Protocol):
    """Proposes the tokens that may follow each decoding sequence; the executor verifies them.

    Proposals are vocabulary ids, at most ``max_proposals`` per sequence
    (none is fine: that sequence decodes one token), and depend only on the
    speculator's state and the requests it is given. Proposing more costs
    the executor more positions per step; a speculator that adapts how many
    it proposes to how many are kept (:meth:`observe`) keeps a workload
    where guesses fail as fast as plain decoding.
    """

    def propose(self, requests: SequenceOf[ProposalRequest]) -> list[list[int]]:
        """Per request, in order, the proposed tokens that follow its ``token_ids``."""
        ...

    def observe(self, seq_id: int, num_proposed: int, num_accepted: int) -> None:
        """How many of the sequence's last proposals the executor kept (after each step that verified some)."""
        ...

    def free(self, seq_id: int) -> None:
        """The sequence has finished: forget it (its id is never proposed for again)."""
        ...

    def close(self) -> None:
        """Release whatever the speculator holds (a draft model, its cache)."""
        ...


class Speculation:
    """The engine's side of a speculator: asks it for proposals and feeds back what was kept, safely."""

    def __init__(self, speculator: Speculator, plugin: str, vocab_size: int) -> None:
        self.speculator = speculator
        self.plugin = plugin
        self.vocab_size = vocab_size
        self.is_on = True

    def propose(self, requests: list[ProposalRequest]) -> dict[int, list[int]]:
        """Proposals by sequence id (only sequences that got some)."""
        if not self.is_on or not requests:
            return {}
        try:
            proposals = self.speculator.propose(requests)
            problem = self._problem(proposals, requests)
        except Exception as exc:  # the speculator's fault: decoding goes on without it
            self._turn_off(f"propose raised {type(exc).__name__}: {exc}", exc)
            return {}
        if problem:
            self._turn_off(problem)
            return {}
        return {r.seq_id: list(p) for r, p in zip(requests, proposals, strict=True) if p}

    def observe(self, seq_id: int, num_proposed: int, num_accepted: int) -> None:
        self._call("observe", seq_id, num_proposed, num_accepted)

    def free(self, seq_id: int) -> None:
        self._call("free", seq_id)

    def close(self) -> None:
        try:
            self.speculator.close()
        except Exception as exc:  # closing must not fail the engine's close
            log.error("speculator failed to close", plugin=self.plugin, error=f"{type(exc).__name__}: {exc}")

    def _call(self, method: str, *args: int) -> None:
        if not self.is_on:
            return
        try:
            getattr(self.speculator, method)(*args)
        except Exception as exc:  # the speculator's fault: decoding goes on without it
            self._turn_off(f"{method} raised {type(exc).__name__}: {exc}", exc)

    def _problem(self, proposals: object, requests: list[ProposalRequest]) -> str | None:
        if not isinstance(proposals, list) or len(proposals) != len(requests):
            return f"propose returned {type(proposals).__name__}, not a list of {len(requests)} proposals"
        for request, proposal in zip(requests, proposals, strict=True):
            if not isinstance(proposal, list) or len(proposal) > request.max_proposals:
                return (
                    f"propose returned {proposal!r:.80} for sequence {request.seq_id},"
                    f" not a list of at most {request.max_proposals} tokens"
                )
            for token in proposal:
                if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self.vocab_size:
                    return (
                        f"propose returned token {token!r} for sequence {request.seq_id},"
                        f" outside the vocabulary [0, {self.vocab_size})"
                    )
        return None

    def _turn_off(self, problem: str, exc: BaseException | None = None) -> None:
        self.is_on = False
        log.error("speculator failed; decoding goes on without it", plugin=self.plugin, problem=problem, exc_info=exc)
