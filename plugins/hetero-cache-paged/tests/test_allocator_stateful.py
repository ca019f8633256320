"""Any sequence of allocate / append / fork / free on a tiny pool keeps the books straight.

A shadow model tracks what every physical block holds (token ids written
there) by replaying the allocator's block tables and copy-on-write copies,
so a prefix-cache hit that hands out wrong contents is caught.
"""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hetero_cache_paged import PagedAllocator


class AllocatorMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(2, 12), block_size=st.integers(1, 4), prefix=st.booleans())
    def build(self, num_blocks, block_size, prefix) -> None:
        self.allocator = PagedAllocator(num_blocks, block_size, enable_prefix_caching=prefix)
        self.size = block_size
        self.tokens: dict[int, list[int]] = {}  # seq -> its known tokens
        self.computed: dict[int, int] = {}  # seq -> tokens written to the cache
        self.slots: dict[tuple[int, int], int] = {}  # (block, offset) -> token written there
        self.next_id = 0

    def write(self, seq: int, start: int, end: int) -> None:
        table = self.allocator.block_table(seq)
        for position in range(start, end):
            self.slots[(table[position // self.size], position % self.size)] = self.tokens[seq][position]

    def check_contents(self, seq: int, upto: int) -> None:
        table = self.allocator.block_table(seq)
        for position in range(upto):
            assert self.slots.get((table[position // self.size], position % self.size)) == self.tokens[seq][position]

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=12))
    def allocate(self, tokens) -> None:
        seq, self.next_id = self.next_id, self.next_id + 1
        cached = self.allocator.allocate(seq, tokens)
        assert cached % self.size == 0 and 0 <= cached < len(tokens)
        self.tokens[seq], self.computed[seq] = list(tokens), cached
        self.check_contents(seq, cached)  # a hit holds exactly the requested tokens

    @precondition(lambda self: self.computed)
    @rule(data=st.data(), num_new=st.integers(1, 6), extra=st.lists(st.integers(0, 2), max_size=3))
    def append(self, data, num_new, extra) -> None:
        seq = data.draw(st.sampled_from(sorted(self.computed)))
        self.tokens[seq].extend(extra)
        computed = self.computed[seq]
        num_new = min(num_new, len(self.tokens[seq]) - computed)
        if num_new == 0:
            return
        can = self.allocator.can_append(seq, computed, num_new)
        try:
            copies = self.allocator.append_slots(seq, self.tokens[seq], computed, num_new)
        except Exception:
            assert not can
            return
        assert can
        for copy in copies:
            for offset in range(self.size):
                if (copy.src, offset) in self.slots:
                    self.slots[(copy.dst, offset)] = self.slots[(copy.src, offset)]
        self.write(seq, computed, computed + num_new)
        self.computed[seq] = computed + num_new
        self.check_contents(seq, computed + num_new)

    @precondition(lambda self: self.computed)
    @rule(data=st.data())
    def fork(self, data) -> None:
        parent = data.draw(st.sampled_from(sorted(self.computed)))
        child, self.next_id = self.next_id, self.next_id + 1
        self.allocator.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent][: self.computed[parent]])
        self.computed[child] = self.computed[parent]

    @precondition(lambda self: self.computed)
    @rule(data=st.data())
    def free(self, data) -> None:
        seq = data.draw(st.sampled_from(sorted(self.computed)))
        self.allocator.free(seq)
        del self.computed[seq], self.tokens[seq]

    @invariant()
    def books_balance(self) -> None:
        if not hasattr(self, "allocator"):
            return
        allocator = self.allocator
        stats = allocator.stats()
        assert stats.used_blocks + stats.free_blocks + stats.cached_blocks == stats.total_blocks
        owners = Counter(b for seq in self.computed for b in allocator.block_table(seq))
        for block in range(allocator.num_blocks):
            assert allocator.refcount(block) == owners[block] >= 0
        assert stats.used_blocks == len(owners)
        assert stats.num_sequences == len(self.computed)
        for seq in self.computed:
            self.check_contents(seq, self.computed[seq])

    def teardown(self) -> None:
        if not hasattr(self, "allocator"):
            return
        for seq in list(self.computed):
            self.allocator.free(seq)
        stats = self.allocator.stats()
        assert stats.used_blocks == 0 and stats.free_blocks + stats.cached_blocks == stats.total_blocks


AllocatorMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestAllocatorMachine = AllocatorMachine.TestCase
