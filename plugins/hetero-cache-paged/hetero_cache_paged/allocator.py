"""Block tables over a fixed pool, with reference counts, copy-on-write and a prefix cache.

Every physical block is in exactly one of three states:

- *free*: no owner, no content worth keeping (``_free``);
- *used*: in at least one block table, ``refcount > 0``;
- *cached*: no owner, but full and hashed, so a later prompt with the same
  prefix can take it back (``_cached``, least recently freed first).

A fresh block comes from the free list, or, when that is empty, by evicting
the least recently used cached block. A full block's hash chains its
parent's hash and its own tokens; the tokens are stored with the block and
compared on every hit, so a hash collision can never hand out wrong KV.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Sequence as SequenceOf

from hetero_core.batch import BlockCopy
from hetero_core.errors import CacheMemoryError, SchedulerError
from hetero_core.memory import MemoryStats

ROOT_HASH = 0


def block_hash(parent_hash: int, tokens: tuple[int, ...]) -> int:
    """The prefix-cache key of a full block, chained over every block before it."""
    return hash((parent_hash, tokens))


class PagedAllocator:
    """The ``paged`` :class:`~hetero_core.protocols.CacheAllocator`.

    :param num_blocks: blocks in the pool.
    :param block_size: token slots per block.
    :param enable_prefix_caching: keep freed full blocks for reuse by later prompts.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks} and {block_size}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._refcount = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()  # LRU order: first = evicted first
        self._hash_of: dict[int, int] = {}  # block -> its hash, for full computed blocks
        self._tokens_of: dict[int, tuple[int, ...]] = {}  # block -> the tokens it holds
        self._block_of: dict[int, int] = {}  # hash -> block
        self._tables: dict[int, list[int]] = {}
        self._hashed: dict[int, tuple[int, int]] = {}  # seq -> (leading blocks hashed, chain hash of the last)
        self._num_used = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    # ------------------------------------------------------------------ protocol

    def allocate(self, seq_id: int, token_ids: SequenceOf[int]) -> int:
        if seq_id in self._tables:
            raise SchedulerError(f"sequence {seq_id} already has a block table")
        table: list[int] = []
        self._tables[seq_id] = table
        self._hashed[seq_id] = (0, ROOT_HASH)
        if not self.enable_prefix_caching:
            return 0
        size = self._block_size
        max_blocks = (len(token_ids) - 1) // size  # the last token is always recomputed
        chain = ROOT_HASH
        for index in range(max_blocks):
            tokens = tuple(token_ids[index * size : (index + 1) * size])
            key = block_hash(chain, tokens)
            block = self._block_of.get(key)
            if block is None or self._tokens_of[block] != tokens:
                break
            self._take(block)
            table.append(block)
            chain = key
        self._hashed[seq_id] = (len(table), chain)
        self.prefix_cache_queries += len(token_ids)
        self.prefix_cache_hits += len(table) * size
        return len(table) * size

    def can_append(self, seq_id: int, num_computed_tokens: int, num_new_tokens: int) -> bool:
        return self._blocks_needed(seq_id, num_computed_tokens, num_new_tokens) <= len(self._free) + len(self._cached)

    def append_slots(
        self, seq_id: int, token_ids: SequenceOf[int], num_computed_tokens: int, num_new_tokens: int
    ) -> list[BlockCopy]:
        table = self._table(seq_id)
        needed = self._blocks_needed(seq_id, num_computed_tokens, num_new_tokens)
        available = len(self._free) + len(self._cached)
        if needed > available:
            raise CacheMemoryError(f"sequence {seq_id} needs {needed} more KV blocks, {available} are available")
        if self.enable_prefix_caching:
            self._hash_computed_blocks(seq_id, token_ids, num_computed_tokens)
        size = self._block_size
        copies = []
        for index in range(num_computed_tokens // size, min(len(table), -(-(num_computed_tokens + num_new_tokens) // size))):
            shared = table[index]
            if self._refcount[shared] > 1:
                private = self._fresh_block()
                self._release(shared)
                table[index] = private
                copies.append(BlockCopy(shared, private))
        while len(table) * size < num_computed_tokens + num_new_tokens:
            table.append(self._fresh_block())
        return copies

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        if child_seq_id in self._tables:
            raise SchedulerError(f"sequence {child_seq_id} already has a block table")
        table = list(self._table(parent_seq_id))
        for block in table:
            self._refcount[block] += 1
        self._tables[child_seq_id] = table
        self._hashed[child_seq_id] = self._hashed[parent_seq_id]

    def free(self, seq_id: int) -> None:
        for block in reversed(self._table(seq_id)):  # the tail is least useful: evicted first
            self._release(block)
        del self._tables[seq_id]
        del self._hashed[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        return self._table(seq_id)

    def stats(self) -> MemoryStats:
        return MemoryStats(
            total_blocks=self._num_blocks,
            used_blocks=self._num_used,
            free_blocks=len(self._free),
            cached_blocks=len(self._cached),
            num_sequences=len(self._tables),
            block_size=self._block_size,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
        )

    # ------------------------------------------------------------------ extras

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (used blocks keep their hashes until freed)."""
        while self._cached:
            self._evict_oldest()

    # ------------------------------------------------------------------ internals

    def _table(self, seq_id: int) -> list[int]:
        table = self._tables.get(seq_id)
        if table is None:
            raise SchedulerError(f"sequence {seq_id} has no block table")
        return table

    def _blocks_needed(self, seq_id: int, num_computed_tokens: int, num_new_tokens: int) -> int:
        table = self._table(seq_id)
        size = self._block_size
        end_block = -(-(num_computed_tokens + num_new_tokens) // size)
        growth = max(0, end_block - len(table))
        copies = sum(1 for i in range(num_computed_tokens // size, min(len(table), end_block)) if self._refcount[table[i]] > 1)
        return growth + copies

    def _take(self, block: int) -> None:
        """Add an owner to a cached or used block."""
        if self._refcount[block] == 0:
            del self._cached[block]
            self._num_used += 1
        self._refcount[block] += 1

    def _release(self, block: int) -> None:
        self._refcount[block] -= 1
        if self._refcount[block] == 0:
            self._num_used -= 1
            if block in self._hash_of:
                self._cached[block] = None
            else:
                self._free.append(block)

    def _fresh_block(self) -> int:
        if not self._free:
            self._evict_oldest()
        block = self._free.popleft()
        self._refcount[block] = 1
        self._num_used += 1
        return block

    def _evict_oldest(self) -> None:
        block, _ = self._cached.popitem(last=False)
        del self._block_of[self._hash_of.pop(block)]
        del self._tokens_of[block]
        self._free.append(block)

    def _hash_computed_blocks(self, seq_id: int, token_ids: SequenceOf[int], num_computed_tokens: int) -> None:
        """Enter the sequence's full, computed, not yet hashed blocks into the prefix cache.

        When another block already holds the same tokens (two prompts computed
        them at once), the first one stays the cached copy and this one is
        left unhashed: it returns to the free list when released.
        """
        table = self._tables[seq_id]
        size = self._block_size
        start, chain = self._hashed[seq_id]
        end = min(num_computed_tokens // size, len(table))
        for index in range(start, end):
            block = table[index]
            tokens = tuple(token_ids[index * size : (index + 1) * size])
            chain = block_hash(chain, tokens)
            if block not in self._hash_of and chain not in self._block_of:
                self._hash_of[block] = chain
                self._tokens_of[block] = tokens
                self._block_of[chain] = block
        if end > start:
            self._hashed[seq_id] = (end, chain)
