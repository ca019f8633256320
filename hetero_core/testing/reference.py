"""Reference components for tests: a scheduler policy and a cache allocator with nothing to tune.

This module is a plugin: register it on a fresh plugin manager (with the
built-ins, which bring the ``simple`` tokenizer and the ``mock`` executor)
and an engine runs with no other plugin installed::

    pm = create_plugin_manager(entry_points=False)
    pm.register(hetero_core.testing.reference, name="reference")
    config = EngineConfig(tokenizer="simple", executor="mock", scheduler="reference", cache_allocator="reference")
    engine = InferenceEngine(config, plugin_manager=pm)

The core's own tests run this way, and a plugin author can too: a tokenizer
or executor plugin tested in an engine then needs neither the project's
scheduler nor its paged allocator. Both components follow their protocols
(the contract kit checks them) in the plainest way: the policy serves in
arrival order, the allocator shares blocks only between sibling samples
and has no prefix cache.
"""

from __future__ import annotations

from typing import Sequence as SequenceOf

from hetero_core.errors import CacheMemoryError, SchedulerError
from hetero_core.hookspecs import Register, hookimpl
from hetero_core.memory import MemoryStats
from hetero_core.sequence_view import SequenceView


class ArrivalOrderPolicy:
    """Earliest arrival first (samples of a request by index); the latest arrival is preempted."""

    wants_prefix_match = False

    @staticmethod
    def _key(seq: SequenceView) -> tuple[int, int]:
        return (seq.arrival_index, seq.sample_index)

    def order(self, seqs: SequenceOf[SequenceView]) -> list[SequenceView]:
        return sorted(seqs, key=self._key)

    def choose_victim(self, running: SequenceOf[SequenceView]) -> SequenceView:
        return max(running, key=self._key)


class ReferenceAllocator:
    """Block tables over a free list, with reference counts for the prompt blocks sibling samples share."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self._num_blocks, self._block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # popped from the end: block 0 first
        self._refcount = [0] * num_blocks
        self._tables: dict[int, list[int]] = {}

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def allocate(self, seq_id: int, token_ids: SequenceOf[int], sibling_of: int | None = None) -> int:
        if seq_id in self._tables:
            raise SchedulerError(f"sequence {seq_id} already has a block table")
        table = [] if sibling_of is None else self._table(sibling_of)[: (len(token_ids) - 1) // self._block_size]
        for block in table:
            self._refcount[block] += 1
        self._tables[seq_id] = table
        return len(table) * self._block_size

    def num_cached_prefix_tokens(self, token_ids: SequenceOf[int]) -> int:
        return 0

    def can_append(self, seq_id: int, num_computed_tokens: int, num_new_tokens: int) -> bool:
        return self._num_needed(self._table(seq_id), num_computed_tokens, num_new_tokens) <= len(self._free)

    def append_slots(
        self, seq_id: int, token_ids: SequenceOf[int], num_computed_tokens: int, num_new_tokens: int
    ) -> None:
        table = self._table(seq_id)
        needed = self._num_needed(table, num_computed_tokens, num_new_tokens)
        if needed > len(self._free):
            raise CacheMemoryError(f"sequence {seq_id} needs {needed} more KV blocks, {len(self._free)} are free")
        while len(table) * self._block_size < num_computed_tokens + num_new_tokens:
            table.append(self._take())

    def trim(self, seq_id: int, num_tokens: int) -> None:
        table = self._table(seq_id)
        while len(table) * self._block_size >= num_tokens + self._block_size:
            self._release(table.pop())

    def free(self, seq_id: int) -> None:
        for block in self._table(seq_id):
            self._release(block)
        del self._tables[seq_id]

    def block_table(self, seq_id: int) -> list[int]:
        return self._table(seq_id)

    def stats(self) -> MemoryStats:
        free = len(self._free)
        return MemoryStats(
            total_blocks=self._num_blocks,
            used_blocks=self._num_blocks - free,
            free_blocks=free,
            cached_blocks=0,
            num_sequences=len(self._tables),
            block_size=self._block_size,
        )

    def _table(self, seq_id: int) -> list[int]:
        table = self._tables.get(seq_id)
        if table is None:
            raise SchedulerError(f"sequence {seq_id} has no block table")
        return table

    def _num_needed(self, table: list[int], num_computed_tokens: int, num_new_tokens: int) -> int:
        size = self._block_size
        if not 0 <= num_computed_tokens <= len(table) * size or num_new_tokens < 0:
            raise SchedulerError(
                f"num_computed_tokens={num_computed_tokens} and num_new_tokens={num_new_tokens} do not fit the table"
            )
        return max(0, -(-(num_computed_tokens + num_new_tokens) // size) - len(table))

    def _take(self) -> int:
        block = self._free.pop()
        self._refcount[block] = 1
        return block

    def _release(self, block: int) -> None:
        self._refcount[block] -= 1
        if self._refcount[block] == 0:
            self._free.append(block)


@hookimpl
def register_scheduler_policies(register: Register) -> None:
    register("reference", ArrivalOrderPolicy)


@hookimpl
def register_cache_allocators(register: Register) -> None:
    register("reference", ReferenceAllocator)
