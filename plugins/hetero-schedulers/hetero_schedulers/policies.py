"""Who is admitted first and who is preempted first.

``fcfs`` and ``priority`` are total orders on a key; the queue is served in
ascending key order and the running sequence with the largest key is the
preemption victim, so a preempted sequence comes back exactly where its
arrival places it. ``lpm`` serves the waiting sequences with the longest
prefix-cache match first, within a bound on how often a request is passed
over. Ties between samples of one request break on the sample index.
"""

from __future__ import annotations

from typing import Sequence as SequenceOf

from hetero_core.errors import ConfigError
from hetero_core.sequence_view import SequenceView


class FcfsPolicy:
    """First come, first served: earliest arrival first; the latest arrival is preempted."""

    wants_prefix_match = False

    @staticmethod
    def key(seq: SequenceView) -> tuple[int, int]:
        return (seq.arrival_index, seq.sample_index)

    def order(self, seqs: SequenceOf[SequenceView]) -> list[SequenceView]:
        return sorted(seqs, key=self.key)

    def choose_victim(self, running: SequenceOf[SequenceView]) -> SequenceView:
        return max(running, key=self.key)


class PriorityPolicy(FcfsPolicy):
    """Lower ``priority`` value first, then arrival; the lowest priority, latest arrival is preempted.

    Equal priorities are served in arrival order, so none of them starves.
    """

    @staticmethod
    def key(seq: SequenceView) -> tuple[int, int, int]:  # type: ignore[override]
        return (seq.priority, seq.arrival_index, seq.sample_index)


class LongestPrefixMatchPolicy:
    """Longest prefix-cache match first: requests that share a cached prefix run while it is cached.

    Waiting sequences are served by how many of their tokens the prefix cache
    holds now (most first, then arrival). Preferring cached prefixes keeps a
    shared system prompt's blocks in use, so they are not evicted between the
    requests that share it, and admits more requests per step's token budget.

    No request starves: once ``max_overtakes`` later requests have arrived,
    a request goes ahead of every request younger than it, whatever their
    matches, so at most ``max_overtakes`` later arrivals are ever admitted
    before it. Overdue requests go in arrival order. Running sequences
    (whose match is not looked up) keep arrival order, and the victim of a
    preemption is the sequence this order serves last: the latest arrival.
    """

    wants_prefix_match = True

    def __init__(self, max_overtakes: int = 64) -> None:
        if isinstance(max_overtakes, bool) or not isinstance(max_overtakes, int) or max_overtakes < 0:
            raise ConfigError(
                f"scheduler option max_overtakes must be a non-negative integer, got {max_overtakes!r}",
                param="scheduler.max_overtakes",
            )
        self.max_overtakes = max_overtakes

    def order(self, seqs: SequenceOf[SequenceView]) -> list[SequenceView]:
        if not seqs:
            return []
        overdue_before = max(s.arrival_index for s in seqs) - self.max_overtakes
        return sorted(seqs, key=lambda s: self._key(s, overdue_before))

    def choose_victim(self, running: SequenceOf[SequenceView]) -> SequenceView:
        return self.order(running)[-1]

    @staticmethod
    def _key(seq: SequenceView, overdue_before: int) -> tuple[int, int, int]:
        if seq.arrival_index < overdue_before:
            return (-1 << 62, seq.arrival_index, seq.sample_index)  # overdue: before any match, by arrival
        return (-seq.num_prefix_match_tokens, seq.arrival_index, seq.sample_index)
