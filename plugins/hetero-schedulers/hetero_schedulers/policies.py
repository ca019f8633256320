"""Who is admitted first and who is preempted first.

Both policies are total orders on a key; the waiting queue is served in
ascending key order and the running sequence with the largest key is the
preemption victim, so a preempted sequence comes back exactly where its
arrival places it. Ties between samples of one request break on the
sample index.
"""

from __future__ import annotations

from typing import Sequence as SequenceOf

from hetero_core.sequence import Sequence


class FcfsPolicy:
    """First come, first served: earliest arrival first; the latest arrival is preempted."""

    @staticmethod
    def key(seq: Sequence) -> tuple[int, int]:
        return (seq.request.arrival_index, seq.index)

    def order_waiting(self, waiting: SequenceOf[Sequence]) -> list[Sequence]:
        return sorted(waiting, key=self.key)

    def choose_victim(self, running: SequenceOf[Sequence]) -> Sequence:
        return max(running, key=self.key)


class PriorityPolicy(FcfsPolicy):
    """Lower ``priority`` value first, then arrival; the lowest priority, latest arrival is preempted.

    Equal priorities are served in arrival order, so none of them starves.
    """

    @staticmethod
    def key(seq: Sequence) -> tuple[int, int, int]:  # type: ignore[override]
        return (seq.request.priority, seq.request.arrival_index, seq.index)
