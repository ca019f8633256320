"""Shortest prompt first, aged by arrival order.

A sequence's score is its remaining prompt length minus ``aging`` tokens for
every request that arrived after it; the smallest score goes first. Short
prompts jump the queue (lower time to first token on mixed loads), and every
later arrival moves a waiting prompt ``aging`` tokens closer to the front,
so none waits forever.
"""

from __future__ import annotations

from typing import Sequence as SequenceOf

from hetero_core.errors import ConfigError
from hetero_core.sequence_view import SequenceView


class ShortestPromptFirst:
    """The ``sjf`` scheduler policy; ``aging`` is the option set in the config."""

    def __init__(self, aging: int = 8) -> None:
        if isinstance(aging, bool) or not isinstance(aging, int) or aging <= 0:
            raise ConfigError(f"scheduler option aging must be a positive integer, got {aging!r}", param="aging")
        self.aging = aging

    wants_prefix_match = False  # the scheduler need not look up prefix-cache matches for this policy

    def _score(self, seq: SequenceView, newest: int) -> tuple[int, int, int]:
        remaining = seq.num_prompt_tokens + seq.num_output_tokens - seq.num_computed_tokens
        waited = newest - seq.arrival_index
        return (remaining - self.aging * waited, seq.arrival_index, seq.sample_index)

    def order(self, seqs: SequenceOf[SequenceView]) -> list[SequenceView]:
        if not seqs:
            return []
        newest = max(s.arrival_index for s in seqs)
        return sorted(seqs, key=lambda s: self._score(s, newest))

    def choose_victim(self, running: SequenceOf[SequenceView]) -> SequenceView:
        """The most recent arrival: it has the least invested work."""
        return max(running, key=lambda s: (s.arrival_index, s.sample_index))
