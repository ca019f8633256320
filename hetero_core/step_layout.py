"""A step's batch as flat arrays, derived once: where each token goes in the cache, and which rows decode.

Every executor needs the same facts about a batch: each new token's id,
position and cache slot (the token at position ``p`` goes to slot
``block_table[p // block_size] * block_size + p % block_size``), which
sequences decode (one new token after a cached prefix) and which compute a
prompt chunk, where each sequence's tokens start in the flattened batch,
and which rows are sampled (a sequence's last, and one before each of its
proposals). :func:`layout` works them out once per step,
with numpy, so no executor derives them again.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from hetero_core.batch import ExecutionBatch, ScheduledSequence


def is_decode(seq: ScheduledSequence) -> bool:
    """One new token after a cached prefix: the shape a decode kernel serves."""
    return len(seq.token_ids) == 1 and seq.start_position > 0


def slots(block_table: Sequence[int], positions: np.ndarray, block_size: int) -> np.ndarray:
    """The cache slots (int64) of ``positions``, ascending and contiguous, in a sequence with ``block_table``."""
    first = int(positions[0]) // block_size
    blocks = np.asarray(block_table[first : int(positions[-1]) // block_size + 1], dtype=np.int64)
    return _slots(blocks[positions // block_size - first], positions, block_size)


def _slots(blocks: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """``blocks``: the physical block holding each position."""
    return blocks * block_size + positions % block_size


@attrs.frozen
class StepLayout:
    """The batch flattened in forward-pass order: decodes first (shortest context first), then prompt chunks.

    Sequence ``i`` of :attr:`sequences` owns rows ``query_start[i]:query_start[i + 1]``
    of the token arrays; the first :attr:`num_decodes` sequences own one row each.
    """

    sequences: list[ScheduledSequence]
    num_decodes: int
    block_size: int
    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64: the cache slot each new token's key and value go to
    query_start: np.ndarray  # [S + 1] int32
    context_lens: np.ndarray  # [S] int32: cached + new tokens of each sequence after this step
    # [sampled rows] int64: per sequence with do_sample, in order, its last row and the row before each proposal
    sample_rows: np.ndarray

    @property
    def decodes(self) -> list[ScheduledSequence]:
        return self.sequences[: self.num_decodes]

    @property
    def prefills(self) -> list[ScheduledSequence]:
        return self.sequences[self.num_decodes :]

    @property
    def sampled(self) -> list[ScheduledSequence]:
        return [s for s in self.sequences if s.do_sample]

    def block_tables(self, start: int, stop: int, *, pad: int = 0, width: int | None = None) -> np.ndarray:
        """Block tables [stop - start, width] (int32) of sequences ``start:stop``, each cut to its context, padded
        with ``pad``."""
        needed = -(-self.context_lens[start:stop] // self.block_size)
        width = max(int(needed.max(initial=1)), 1) if width is None else width
        tables = np.full((stop - start, width), pad, dtype=np.int32)
        for row, (seq, count) in enumerate(zip(self.sequences[start:stop], needed, strict=True)):
            tables[row, :count] = seq.block_table[:count]
        return tables


def layout(batch: ExecutionBatch) -> StepLayout:
    """The batch's :class:`StepLayout`."""
    decodes = sorted((s for s in batch.sequences if is_decode(s)), key=lambda s: s.start_position)
    chunks = [s for s in batch.sequences if not is_decode(s)]
    ordered = decodes + chunks
    lengths = np.array([len(s.token_ids) for s in ordered], dtype=np.int64)
    starts = np.array([s.start_position for s in ordered], dtype=np.int64)
    query_start = np.zeros(len(ordered) + 1, dtype=np.int64)
    np.cumsum(lengths, out=query_start[1:])
    total = int(query_start[-1])
    input_ids = np.empty(total, dtype=np.int64)
    positions = np.empty(total, dtype=np.int64)
    slot_mapping = np.empty(total, dtype=np.int64)
    size, n = batch.block_size, len(decodes)
    if n:  # one row each: vectorised over the decodes
        input_ids[:n] = [s.token_ids[0] for s in decodes]
        positions[:n] = starts[:n]
        blocks = np.array([s.block_table[s.start_position // size] for s in decodes], dtype=np.int64)
        slot_mapping[:n] = _slots(blocks, positions[:n], size)
    for i, seq in enumerate(chunks, start=n):
        rows = slice(query_start[i], query_start[i + 1])
        input_ids[rows] = seq.token_ids
        positions[rows] = np.arange(starts[i], starts[i] + lengths[i])
        slot_mapping[rows] = slots(seq.block_table, positions[rows], size)
    sampled = [i for i, s in enumerate(ordered) if s.do_sample]
    ends = query_start[1:]
    if any(ordered[i].num_proposed for i in sampled):
        sample_rows = np.concatenate([np.arange(ends[i] - ordered[i].num_proposed - 1, ends[i]) for i in sampled])
    else:
        sample_rows = ends[sampled] - 1
    return StepLayout(
        sequences=ordered,
        num_decodes=len(decodes),
        block_size=batch.block_size,
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        query_start=query_start.astype(np.int32),
        context_lens=(starts + lengths).astype(np.int32),
        sample_rows=sample_rows,
    )
