"""KV-cache occupancy as the allocator reports it."""

from __future__ import annotations

import attrs


@attrs.frozen
class MemoryStats:
    """A snapshot of the block pool.

    ``used + free + cached == total`` always holds: *cached* blocks belong to
    no sequence but keep their contents for prefix-cache hits, and are
    reclaimed (least recently used first) when free blocks run out.
    Prefix-cache figures count prompt tokens looked up and found.
    """

    total_blocks: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int
    num_sequences: int
    block_size: int
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0

    @property
    def usage(self) -> float:
        """Fraction of the pool held by live sequences (cached blocks count as available)."""
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0
