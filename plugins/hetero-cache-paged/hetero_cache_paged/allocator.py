"""Per-sequence block tables over a :class:`~hetero_cache_paged.block_pool.BlockPool`.

Sharing: a block is in several tables only when it is full and computed
(a prefix-cache hit, or the prompt blocks of sibling samples), so no
block is written while shared; writing one raises ``SchedulerError``.

Prefix caching: a block is sealed (entered into the prefix cache) once all
of its tokens are computed, which :meth:`PagedAllocator.append_slots` learns
from ``num_computed_tokens``; a block therefore becomes reusable one step
after it fills. Its key chains the previous block's key with its own
tokens, and each sequence remembers how far it has sealed, so hashing
resumes where it stopped.
"""

from __future__ import annotations

from typing import Iterator
from typing import Sequence as SequenceOf

import attrs

from hetero_cache_paged.block_pool import ROOT_IDENTITY, BlockPool
from hetero_core.errors import CacheMemoryError, ConfigError, SchedulerError
from hetero_core.memory import MemoryStats

ROOT_KEY = 0


def block_hash(parent_key: int, tokens: tuple[int, ...]) -> int:
    """The prefix-cache key of a full block, chained over the keys of the blocks before it."""
    return hash((parent_key, tokens))


@attrs.define
class _SequenceBlocks:
    """A sequence's block table and how far its prefix has been sealed."""

    table: list[int]
    num_sealed: int = 0  # leading blocks sealed in the prefix cache
    key: int = ROOT_KEY  # the chained key of the last sealed block
    identity: int = ROOT_IDENTITY  # the identity of the last sealed block


class PagedAllocator:
    """The ``paged`` :class:`~hetero_core.protocols.CacheAllocator`.

    Misuse by the caller (an unknown or duplicate sequence id, counts that
    do not fit the table) raises :class:`~hetero_core.errors.SchedulerError`
    naming the sequence; running out of blocks raises
    :class:`~hetero_core.errors.CacheMemoryError` and changes nothing.
    The prefix-cache counters of :meth:`stats` count the prompt tokens of
    every :meth:`allocate` (queries) and those found cached (hits), while
    prefix caching is on.

    :param num_blocks: blocks in the pool.
    :param block_size: token slots per block.
    :param enable_prefix_caching: keep the blocks of computed prompts for later prompts that share their prefix.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}", param=name)
        if not isinstance(enable_prefix_caching, bool):
            raise ConfigError(
                f"enable_prefix_caching must be true or false, got {enable_prefix_caching!r}",
                param="cache_allocator.enable_prefix_caching",
            )
        self._block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._pool = BlockPool(num_blocks)
        self._sequences: dict[int, _SequenceBlocks] = {}
        self._prefix_cache_queries = 0
        self._prefix_cache_hits = 0

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_blocks(self) -> int:
        return self._pool.num_blocks

    # ------------------------------------------------------------------ protocol

    def allocate(self, seq_id: int, token_ids: SequenceOf[int], sibling_of: int | None = None) -> int:
        if seq_id in self._sequences:
            raise SchedulerError(f"sequence {seq_id} already has a block table")
        if sibling_of is not None:
            return self._share_prompt(seq_id, token_ids, sibling_of)
        blocks = _SequenceBlocks([])
        self._sequences[seq_id] = blocks
        if not self.enable_prefix_caching:
            return 0
        for block, key, identity in self._cached_prefix(token_ids):
            self._pool.share(block)
            blocks.table.append(block)
            blocks.key, blocks.identity = key, identity
        blocks.num_sealed = len(blocks.table)
        num_cached = len(blocks.table) * self._block_size
        self._prefix_cache_queries += len(token_ids)
        self._prefix_cache_hits += num_cached
        return num_cached

    def num_cached_prefix_tokens(self, token_ids: SequenceOf[int]) -> int:
        if not self.enable_prefix_caching:
            return 0
        return sum(1 for _ in self._cached_prefix(token_ids)) * self._block_size

    def can_append(self, seq_id: int, num_computed_tokens: int, num_new_tokens: int) -> bool:
        blocks = self._blocks(seq_id)
        self._check_counts(seq_id, blocks, num_computed_tokens, num_new_tokens)
        return self._num_blocks_needed(blocks.table, num_computed_tokens, num_new_tokens) <= self._pool.num_available

    def append_slots(
        self, seq_id: int, token_ids: SequenceOf[int], num_computed_tokens: int, num_new_tokens: int
    ) -> None:
        blocks = self._blocks(seq_id)
        self._check_counts(seq_id, blocks, num_computed_tokens, num_new_tokens)
        end = num_computed_tokens + num_new_tokens
        if len(token_ids) < end:
            raise SchedulerError(
                f"sequence {seq_id}: token_ids has {len(token_ids)} tokens, fewer than the {end} to cover"
            )
        table, pool, size = blocks.table, self._pool, self._block_size
        first = num_computed_tokens // size
        if num_new_tokens and first < len(table) and pool.refcount(table[first]) > 1:
            raise SchedulerError(
                f"sequence {seq_id} would write position {num_computed_tokens} into block {table[first]},"
                f" which {pool.refcount(table[first])} sequences share"
            )
        needed = self._num_blocks_needed(table, num_computed_tokens, num_new_tokens)
        if needed > pool.num_available:
            raise CacheMemoryError(
                f"sequence {seq_id} needs {needed} more KV blocks, {pool.num_available} are available"
            )
        if self.enable_prefix_caching and first > blocks.num_sealed:
            self._seal_computed_blocks(blocks, token_ids, num_computed_tokens)
        while len(table) * size < end:
            table.append(pool.take_fresh())

    def trim(self, seq_id: int, num_tokens: int) -> None:
        blocks = self._blocks(seq_id)
        keep = -(-num_tokens // self._block_size)
        if num_tokens < 0 or keep < blocks.num_sealed:
            raise SchedulerError(
                f"sequence {seq_id}: cannot trim to {num_tokens} tokens, below its {blocks.num_sealed} computed blocks"
            )
        while len(blocks.table) > keep:
            self._pool.release(blocks.table.pop())

    def free(self, seq_id: int) -> None:
        blocks = self._blocks(seq_id)
        for block in reversed(blocks.table):  # the tail is the least reusable: it is evicted first
            self._pool.release(block)
        del self._sequences[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        return self._blocks(seq_id).table

    def stats(self) -> MemoryStats:
        pool = self._pool
        return MemoryStats(
            total_blocks=pool.num_blocks,
            used_blocks=pool.num_used,
            free_blocks=pool.num_free,
            cached_blocks=pool.num_cached,
            num_sequences=len(self._sequences),
            block_size=self._block_size,
            prefix_cache_queries=self._prefix_cache_queries,
            prefix_cache_hits=self._prefix_cache_hits,
        )

    # ------------------------------------------------------------------ introspection and upkeep

    def refcount(self, block: int) -> int:
        """How many block tables hold ``block``."""
        return self._pool.refcount(block)

    def is_cached(self, block: int) -> bool:
        """Whether ``block`` is ownerless but kept for prefix-cache hits."""
        return self._pool.is_cached(block)

    def reset_prefix_cache(self) -> None:
        """Free every cached block, so that later prompts start cold (blocks in use are kept)."""
        self._pool.reset_prefix_cache()

    # ------------------------------------------------------------------ internals

    def _cached_prefix(self, token_ids: SequenceOf[int]) -> Iterator[tuple[int, int, int]]:
        """The cached blocks holding the leading full blocks of ``token_ids``, with each one's key and identity.

        Stops at the first miss, and before the block of the last token, which is always computed again.
        """
        size, pool = self._block_size, self._pool
        key, identity = ROOT_KEY, ROOT_IDENTITY
        for index in range((len(token_ids) - 1) // size):
            tokens = tuple(token_ids[index * size : (index + 1) * size])
            key = block_hash(key, tokens)
            block = pool.lookup(key, identity, tokens)
            if block is None:
                return
            identity = pool.identity(block)
            yield block, key, identity

    def _blocks(self, seq_id: int) -> _SequenceBlocks:
        blocks = self._sequences.get(seq_id)
        if blocks is None:
            raise SchedulerError(f"sequence {seq_id} has no block table")
        return blocks

    def _check_counts(
        self, seq_id: int, blocks: _SequenceBlocks, num_computed_tokens: int, num_new_tokens: int
    ) -> None:
        covered = len(blocks.table) * self._block_size
        if not 0 <= num_computed_tokens <= covered or num_new_tokens < 0:
            raise SchedulerError(
                f"sequence {seq_id}: num_computed_tokens={num_computed_tokens} must be within the"
                f" {covered} slots of its table and num_new_tokens={num_new_tokens} must be >= 0"
            )

    def _num_blocks_needed(self, table: list[int], num_computed_tokens: int, num_new_tokens: int) -> int:
        """Fresh blocks to cover the new tokens."""
        return max(0, -(-(num_computed_tokens + num_new_tokens) // self._block_size) - len(table))

    def _share_prompt(self, seq_id: int, token_ids: SequenceOf[int], sibling_of: int) -> int:
        """Start ``seq_id``'s table with the blocks of its sibling before the block of the last token."""
        sibling, num_shared = self._blocks(sibling_of), (len(token_ids) - 1) // self._block_size
        if len(sibling.table) < num_shared:
            raise SchedulerError(
                f"sequence {sibling_of} holds {len(sibling.table)} blocks, fewer than the {num_shared}"
                f" full prompt blocks sequence {seq_id} would share"
            )
        blocks = _SequenceBlocks(sibling.table[:num_shared])
        if sibling.num_sealed == num_shared:  # else sealed again from the start: a sealed block keeps its registration
            blocks.num_sealed, blocks.key, blocks.identity = sibling.num_sealed, sibling.key, sibling.identity
        for block in blocks.table:
            self._pool.share(block)
        self._sequences[seq_id] = blocks
        return num_shared * self._block_size

    def _seal_computed_blocks(
        self, blocks: _SequenceBlocks, token_ids: SequenceOf[int], num_computed_tokens: int
    ) -> None:
        """Enter the sequence's full, computed, not yet sealed blocks into the prefix cache."""
        size, pool = self._block_size, self._pool
        end = num_computed_tokens // size  # within the table: the computed tokens are in it
        for index in range(blocks.num_sealed, end):
            tokens = tuple(token_ids[index * size : (index + 1) * size])
            key = block_hash(blocks.key, tokens)
            blocks.identity = pool.seal(blocks.table[index], key, blocks.identity, tokens)
            blocks.key = key
        blocks.num_sealed = end
