"""The physical blocks: reference counts, the free list, and the prefix cache.

Every block is in exactly one of three states:

- *free*: no owner and no contents worth keeping (in the free deque);
- *used*: in at least one block table (``refcount > 0``);
- *cached*: no owner, but full, computed and registered in the prefix
  cache, so a later prompt with the same prefix can take it back (in an
  ordered dict, least recently released first).

A fresh block comes off the free list or, when that is empty, by evicting
the least recently used cached block. Every call is O(1) per block touched.

**Identities.** A full, computed block's KV depends on its own tokens *and*
on every token before it. Each such block is therefore *sealed* with an
identity: a serial number, never reused, standing for "these tokens after
the prefix whose identity is ``parent``" (:data:`ROOT_IDENTITY` for the
first block). A registered block stores its tokens and its parent's
identity, and a lookup must match both: the key (a hash) only finds the
candidate, so a hash collision, even a deliberately crafted one, costs a
miss and never hands out foreign keys and values.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from hetero_core.errors import CacheMemoryError

ROOT_IDENTITY = 0


class BlockPool:
    """``num_blocks`` physical blocks and their prefix-cache registrations."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._refcount = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()  # first = least recently used
        self._num_used = 0
        # Prefix-cache registrations, per block (None / 0 when unregistered).
        self._key: list[int | None] = [None] * num_blocks
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._parent: list[int] = [ROOT_IDENTITY] * num_blocks
        self._identity: list[int] = [ROOT_IDENTITY] * num_blocks
        self._block_by_key: dict[int, int] = {}
        self._last_identity = ROOT_IDENTITY

    # ------------------------------------------------------------------ occupancy

    @property
    def num_used(self) -> int:
        return self._num_used

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_available(self) -> int:
        """Blocks a fresh allocation can take: free ones plus evictable cached ones."""
        return len(self._free) + len(self._cached)

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def is_cached(self, block: int) -> bool:
        return block in self._cached

    # ------------------------------------------------------------------ ownership

    def take_fresh(self) -> int:
        """An empty block with one owner, evicting the least recently used cached block if need be."""
        if not self._free:
            if not self._cached:
                raise CacheMemoryError(f"all {self.num_blocks} KV blocks are in use")
            self._evict_oldest()
        block = self._free.popleft()
        self._refcount[block] = 1
        self._num_used += 1
        return block

    def share(self, block: int) -> None:
        """Add an owner to a used or cached block (a cached one becomes used)."""
        if self._refcount[block] == 0:
            del self._cached[block]
            self._num_used += 1
        self._refcount[block] += 1

    def release(self, block: int) -> None:
        """Drop an owner; an ownerless block is cached if registered, else freed."""
        self._refcount[block] -= 1
        if self._refcount[block] == 0:
            self._num_used -= 1
            if self._key[block] is not None:
                self._cached[block] = None
            else:
                self._free.append(block)

    # ------------------------------------------------------------------ prefix cache

    def lookup(self, key: int, parent: int, tokens: tuple[int, ...]) -> int | None:
        """The registered block holding ``tokens`` after the prefix ``parent``, found by ``key``."""
        block = self._block_by_key.get(key)
        if block is None or self._parent[block] != parent or self._tokens[block] != tokens:
            return None
        return block

    def identity(self, block: int) -> int:
        """The identity of a registered block."""
        return self._identity[block]

    def seal(self, block: int, key: int, parent: int, tokens: tuple[int, ...]) -> int:
        """Record that ``block`` (used) now holds ``tokens`` after ``parent``; return its identity.

        The block is registered under ``key`` unless it already is, or another
        block holds the key: then an identical registered block lends its
        identity (two sequences computed the same prefix at once) and a
        colliding one is left alone, this block getting a new, unregistered
        identity. Either way the block returns to the free list when released.
        """
        if self._key[block] is not None:
            return self._identity[block]
        holder = self._block_by_key.get(key)
        if holder is not None and self._parent[holder] == parent and self._tokens[holder] == tokens:
            return self._identity[holder]
        self._last_identity += 1
        if holder is None:
            self._key[block] = key
            self._tokens[block] = tokens
            self._parent[block] = parent
            self._identity[block] = self._last_identity
            self._block_by_key[key] = block
        return self._last_identity

    def reset_prefix_cache(self) -> None:
        """Free every cached block (used blocks stay registered until released)."""
        while self._cached:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        block, _ = self._cached.popitem(last=False)
        del self._block_by_key[self._key[block]]
        self._key[block] = None
        self._tokens[block] = None
        self._free.append(block)
