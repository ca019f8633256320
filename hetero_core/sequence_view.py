"""What a scheduler policy sees of a sequence: a read-only window on the core's state.

The scheduler hands a policy one :class:`SequenceView` per sequence instead
of the engine's mutable :class:`~hetero_core.sequence.Sequence`. A view
reads through to the sequence (nothing is copied), so making one costs a
single small object per sequence and call; it has no setters, so a policy
cannot change scheduling state by accident.
"""

from __future__ import annotations

from hetero_core.sequence import Sequence


class SequenceView:
    """One sequence as a :class:`~hetero_core.protocols.SchedulerPolicy` may read it."""

    __slots__ = ("_seq", "_num_prefix_match_tokens")

    def __init__(self, seq: Sequence, num_prefix_match_tokens: int = 0) -> None:
        self._seq = seq
        self._num_prefix_match_tokens = num_prefix_match_tokens

    def __repr__(self) -> str:
        return f"SequenceView(request_id={self.request_id!r}, sample_index={self.sample_index})"

    @property
    def request_id(self) -> str:
        return self._seq.request.request_id

    @property
    def sample_index(self) -> int:
        """Which of its request's ``n`` samples this sequence is (0 for the first)."""
        return self._seq.index

    @property
    def priority(self) -> int:
        """The request's ``priority`` parameter (lower goes first under the ``priority`` policy)."""
        return self._seq.request.params.priority

    @property
    def arrival_index(self) -> int:
        """Submission order, unique per request and increasing: ties in time never reorder requests."""
        return self._seq.request.arrival_index

    @property
    def arrival_time(self) -> float:
        """When the request was submitted (``time.monotonic()`` seconds)."""
        return self._seq.request.arrival_time

    @property
    def num_prompt_tokens(self) -> int:
        return self._seq.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far (kept across a preemption)."""
        return self._seq.num_output_tokens

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is in the cache now (0 while waiting)."""
        return self._seq.num_computed_tokens

    @property
    def num_prefix_match_tokens(self) -> int:
        """For a waiting sequence, when the policy sets ``wants_prefix_match``: how many of its
        tokens the cache allocator could serve from its prefix cache now. Otherwise 0."""
        return self._num_prefix_match_tokens


def sequence_of(view: SequenceView) -> Sequence:
    """The sequence behind ``view`` (for the scheduler only)."""
    return view._seq
