"""The step layout against a token-by-token reading of the batch contract."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hetero_core.batch import ExecutionBatch, ScheduledSequence
from hetero_core.params import GenerationParams
from hetero_core.step_layout import layout

PARAMS = GenerationParams()


@st.composite
def batches(draw) -> ExecutionBatch:
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    sequences = []
    for seq_id in range(draw(st.integers(0, 6))):
        start = draw(st.integers(0, 40))
        count = draw(st.integers(1, 20))
        end = start + count
        table = draw(st.lists(st.integers(0, 999), min_size=-(-end // block_size), max_size=-(-end // block_size) + 2))
        tokens = draw(st.lists(st.integers(0, 99), min_size=count, max_size=count))
        sequences.append(
            ScheduledSequence(seq_id, tokens, start, table, draw(st.booleans()), PARAMS, [0] * start + tokens, 1, None)
        )
    return ExecutionBatch(sequences, block_size)


@given(batches())
def test_the_layout_follows_the_batch_contract_token_by_token(batch: ExecutionBatch) -> None:
    step = layout(batch)
    size = batch.block_size
    assert sorted(s.seq_id for s in step.sequences) == [s.seq_id for s in batch.sequences]
    decodes = [s for s in batch.sequences if len(s.token_ids) == 1 and s.start_position > 0]
    assert step.num_decodes == len(decodes)
    assert [s.start_position for s in step.decodes] == sorted(s.start_position for s in decodes)
    assert [s.seq_id for s in step.prefills] == [s.seq_id for s in batch.sequences if s not in decodes]
    rows = 0
    for i, seq in enumerate(step.sequences):
        assert step.query_start[i] == rows
        assert step.context_lens[i] == seq.start_position + len(seq.token_ids)
        for offset, token_id in enumerate(seq.token_ids):
            position = seq.start_position + offset
            assert step.input_ids[rows] == token_id and step.positions[rows] == position
            assert step.slot_mapping[rows] == seq.block_table[position // size] * size + position % size
            rows += 1
        table = step.block_tables(i, i + 1, pad=-1)[0]
        needed = -(-int(step.context_lens[i]) // size)
        assert list(table[:needed]) == seq.block_table[:needed] and set(table[needed:]) <= {-1}
    assert step.query_start[-1] == rows == len(step.input_ids)
    assert list(step.sample_rows) == [step.query_start[i + 1] - 1 for i, s in enumerate(step.sequences) if s.do_sample]
    assert step.sampled == [s for s in step.sequences if s.do_sample]
