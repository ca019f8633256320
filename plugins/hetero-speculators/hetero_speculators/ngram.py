"""``ngram``: prompt lookup. The tokens that followed the latest earlier occurrence of the sequence's last n tokens.

Output that repeats its context (editing a given file, quoting a passage,
filling fields from a given record) is guessed right often. For each
sequence an index maps every n-gram (``min_ngram`` to ``max_ngram`` tokens)
to where its latest occurrence ends; it grows with the sequence, so a
proposal costs a few dictionary lookups, not a scan of the context. The
longest n-gram that ends the sequence and occurred before wins, and the
tokens after that occurrence are the proposal.

A proposal copies from somewhere in the context, and the next one goes on
copying from where the model stopped keeping it. Where the model's own token
there is not the copied one, it is mostly an edit: a token in place of the
copied one (a renamed function), or one more token (a record rewritten over
several lines: a line break before each field); the copy goes on after the
replaced token, or at the one the inserted token went before (and past a
token the model left out). Which of the first two, each sequence learns from
its own edits: it starts with the first, and where a proposal after an edit
is turned down at once, the model's next token tells which it was (the
copied token after the edit's: an insertion; the one after that: a
replacement) and the copy goes on from there. A copy turned down at once
otherwise was a wrong guess: the next proposal looks its suffix up again.

An edit the model made and kept to is remembered under two copied tokens:
the one before it and the one it went before or replaced. Wherever a later
copy passes the same two, the edit is applied: a record rewritten one field
a line gets its line break proposed before every field after the first, a
renamed function its new name at every call. An applied edit the model
turns down is forgotten.

How many it proposes adapts per sequence: after a step that kept every
proposal the bound grows by 2 (up to ``k``), after one that kept some it
becomes one more than were kept (at least 3: a step of one to three
proposals costs about the same), and after ``patience`` steps in a row that
kept none the sequence proposes nothing for a while: 8 steps, doubling at
each further failure up to 256, so a workload where guesses fail costs
almost nothing.
"""

from __future__ import annotations

from typing import Any
from typing import Sequence as SequenceOf

import attrs

from hetero_core.errors import ConfigError
from hetero_core.speculation import ProposalRequest
from hetero_core.validators import number_in

FIRST_PAUSE = 8  # steps without proposals after the first run of failures
MIN_BOUND = 3  # on the CPU a verification step of 2 to 4 rows costs about the same
MAX_PAUSE = 256
GROWTH = 2  # the bound's growth after a step that kept every proposal
LOOKED_UP, CONTINUED, AFTER_EDIT = range(3)  # how a proposal's source was found


def _check_ngram_range(instance: NgramOptions, _attribute: Any, max_ngram: int) -> None:
    if max_ngram < instance.min_ngram:
        raise ConfigError(f"max_ngram={max_ngram} must be at least min_ngram={instance.min_ngram}", param="max_ngram")


@attrs.frozen
class NgramOptions:
    """The options of ``ngram`` (config: ``"speculator": {"name": "ngram", "k": 8}``)."""

    k: int = attrs.field(default=8, validator=number_in(1, 64, integer=True, error=ConfigError))
    min_ngram: int = attrs.field(default=2, validator=number_in(1, 16, integer=True, error=ConfigError))
    max_ngram: int = attrs.field(
        default=4, validator=[number_in(1, 16, integer=True, error=ConfigError), _check_ngram_range]
    )
    patience: int = attrs.field(default=3, validator=number_in(1, 1000, integer=True, error=ConfigError))


@attrs.define
class _SequenceState:
    """One sequence's n-gram index and its adaptive bound."""

    ends: dict[tuple[int, ...], int] = attrs.field(factory=dict)  # n-gram -> where its latest occurrence ends
    num_indexed: int = 0  # n-grams ending at positions up to this one are indexed
    bound: int = 1  # proposals at most, now
    failures: int = 0  # steps in a row that kept nothing
    pause: int = 0  # steps left without proposals
    next_pause: int = FIRST_PAUSE
    found: int = LOOKED_UP  # how the latest proposal's source was found
    resume: int = -1  # where the copy goes on: the source of the model's latest token, -1: nowhere
    inserts: bool = False  # the model's edits insert a token (the copy goes on at it), or replace one
    origins: list[int] = attrs.field(factory=list)  # the latest proposal's token positions, then the next; [] if none
    applied: dict[int, tuple[int, int]] = attrs.field(factory=dict)  # the latest proposal's remembered edits, by index
    edit: _Edit | None = None  # the edit the latest proposal went on after, while unconfirmed
    retry: int = -1  # where an edit was guessed the wrong kind: the model's next token tells which it was
    edits: dict[tuple[int, int], tuple[int, bool]] = attrs.field(factory=dict)  # (before, at) -> (token, inserts)


@attrs.frozen
class _Edit:
    """The model's ``token`` where a copy had the one at ``position``: inserted before it, or in its place."""

    position: int
    key: tuple[int, int]  # the copied tokens at ``position - 1`` and ``position``
    token: int
    inserts: bool


class NgramSpeculator:
    """The ``ngram`` speculator (see the module docstring).

    :param k: the most tokens it proposes for a sequence in one step.
    :param min_ngram: the shortest suffix it looks up.
    :param max_ngram: the longest suffix it looks up (longer matches win).
    :param patience: steps in a row that keep no proposal before a sequence pauses.
    """

    def __init__(
        self,
        config: Any = None,
        model_info: Any = None,
        components: Any = None,
        *,
        k: int = 8,
        min_ngram: int = 2,
        max_ngram: int = 4,
        patience: int = 3,
    ) -> None:
        self.k = k
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.patience = patience
        self._states: dict[int, _SequenceState] = {}

    def propose(self, requests: SequenceOf[ProposalRequest]) -> list[list[int]]:
        return [self._propose(request) for request in requests]

    def observe(self, seq_id: int, num_proposed: int, num_accepted: int) -> None:
        state = self._states.get(seq_id)
        if state is None:
            return
        if num_accepted == num_proposed:
            state.bound = min(self.k, state.bound + GROWTH)
        else:
            state.bound = max(MIN_BOUND, num_accepted + 1)
        edit, state.edit = state.edit, None
        if edit is not None and num_accepted:
            state.edits[edit.key] = (edit.token, edit.inserts)
        if num_accepted < num_proposed and num_accepted in state.applied:  # a remembered edit not made this time
            state.edits.pop(state.applied[num_accepted], None)
        if num_accepted or state.found == CONTINUED:  # a copy that held, or an edit at its first token
            state.resume = state.origins[num_accepted] if state.origins else -1
        else:  # a wrong source: the next proposal looks the suffix up, unless an edit was guessed the wrong kind
            state.resume = -1
            state.retry = edit.position if edit is not None else -1
        if num_accepted:
            state.failures, state.next_pause = 0, FIRST_PAUSE
            return
        state.failures += 1
        if state.failures >= self.patience:
            state.failures, state.pause = 0, state.next_pause
            state.next_pause = min(MAX_PAUSE, 2 * state.next_pause)

    def free(self, seq_id: int) -> None:
        self._states.pop(seq_id, None)

    def close(self) -> None:
        self._states.clear()

    def _propose(self, request: ProposalRequest) -> list[int]:
        state = self._states.get(request.seq_id)
        if state is None:
            state = self._states[request.seq_id] = _SequenceState(bound=self.k)
        tokens = request.token_ids
        self._index(state, tokens)
        resume, state.resume, state.found = state.resume, -1, LOOKED_UP
        state.origins, state.applied = [], {}
        retry, state.retry, state.edit = state.retry, -1, None
        if state.pause:
            state.pause -= 1
            return []
        count = len(tokens)
        start = -1
        if 1 <= retry < count - 2 and tokens[-1] in (tokens[retry], tokens[retry + 1]):
            # the token after the edit's is the copied one (an insertion) or the one after it (a replacement)
            state.inserts = tokens[-1] == tokens[retry]
            state.edits[(tokens[retry - 1], tokens[retry])] = (tokens[-2], state.inserts)
            start, state.found = (retry + 1 if state.inserts else retry + 2), CONTINUED
        elif 0 <= resume < count - 1:
            if tokens[resume] == tokens[-1]:
                start, state.found = resume + 1, CONTINUED
            elif tokens[resume + 1] == tokens[-1]:  # a token left out
                start, state.found = resume + 2, CONTINUED
            else:
                start, state.found = resume + (not state.inserts), AFTER_EDIT
                if resume >= 1:
                    state.edit = _Edit(resume, (tokens[resume - 1], tokens[resume]), tokens[-1], state.inserts)
        else:
            for n in range(min(self.max_ngram, count - 1), self.min_ngram - 1, -1):
                start = state.ends.get(tuple(tokens[count - n :]), -1)
                if start >= 0:
                    break
        if start < 0:
            return []
        return self._copy(state, tokens, start, min(state.bound, request.max_proposals))

    @staticmethod
    def _copy(state: _SequenceState, tokens: list[int], start: int, limit: int) -> list[int]:
        """Up to ``limit`` tokens copied from ``start`` on, with the remembered edits applied on the way (not the
        one just made, at ``start`` after an edit); each token's position goes to ``state.origins``."""
        proposal: list[int] = []
        origins: list[int] = []
        applied: dict[int, tuple[int, int]] = {}
        position = start
        while len(proposal) < limit and position < len(tokens):
            key = (tokens[position - 1], tokens[position]) if position >= 1 else None
            edit = None if position == start and state.edit is not None else state.edits.get(key)
            if edit is not None:
                token, inserts = edit
                applied[len(proposal)] = key
                proposal.append(token)
                origins.append(position)
                if not inserts:  # in place of the copied token
                    position += 1
                    continue
                if len(proposal) == limit:
                    break
            proposal.append(tokens[position])
            origins.append(position)
            position += 1
        origins.append(position)
        state.origins, state.applied = origins, applied
        return proposal

    def _index(self, state: _SequenceState, tokens: list[int]) -> None:
        """Index the n-grams ending before the last position (the suffix looked up must occur earlier)."""
        ends = state.ends
        for end in range(max(state.num_indexed, 1), len(tokens)):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                ends[tuple(tokens[end - n : end])] = end
        state.num_indexed = max(state.num_indexed, len(tokens))
