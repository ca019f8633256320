"""Contract tests for attention backends of the ``torch`` executor.

Subclass :class:`AttentionBackendContract` and override the ``backend``
fixture (and ``device``, where the backend runs elsewhere than the CPU)::

    class TestMyAttention(AttentionBackendContract):
        @pytest.fixture
        def backend(self):
            return MyAttention()

        @pytest.fixture
        def refused(self):  # where configure must refuse (a ConfigError naming ``attention``)
            return [(torch.device("cuda"), torch.float32)]

The checks run the backend on random paged caches: grouped-query heads,
several sequences, decode and prefill rows (prompt chunks with and without a
cached prefix), block tables scattered over the pool. Every slot outside the
sequences' contexts (blocks no table names, the unused tail of a last block)
holds large values, so a backend that reads one cannot go unnoticed. The
reference is plain scaled-dot-product attention over each sequence's context
gathered token by token. Class attributes size the problem and the tolerance.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from hetero_core.batch import ExecutionBatch, ScheduledSequence
from hetero_core.errors import ConfigError
from hetero_core.params import GenerationParams
from hetero_core.step_layout import StepLayout, layout
from hetero_executor_torch.attention_backend import AttentionBackend

POISON = 50.0
GREEDY = GenerationParams(temperature=0.0, max_tokens=4)

# (cached tokens, new tokens) per sequence: one new token after a cached prefix is a decode
MIXES = {
    "decodes": [(5, 1), (1, 1), (11, 1), (8, 1)],
    "prefills": [(0, 7), (6, 5), (3, 2)],
    "mixed": [(9, 1), (0, 6), (4, 1), (5, 4), (0, 1)],
}


def scheduled(seq_id: int, cached: int, new: int, block_table: list[int]) -> ScheduledSequence:
    tokens = list(range(cached + new))
    return ScheduledSequence(
        seq_id=seq_id,
        token_ids=tokens[cached:],
        start_position=cached,
        block_table=block_table,
        do_sample=True,
        params=GREEDY,
        all_token_ids=tokens,
        num_prompt_tokens=len(tokens),
        seed=None,
    )


class AttentionBackendContract:
    """What every attention backend must do (see :class:`hetero_executor_torch.AttentionBackend`)."""

    num_heads = 4
    num_kv_heads = 2  # grouped-query: two query heads share each key/value head
    head_size = 16
    block_size = 4
    num_blocks = 24
    dtype = torch.float32  # of the queries and the cache
    tolerance = dict(atol=1e-4, rtol=1e-4)

    @pytest.fixture
    def backend(self) -> AttentionBackend:
        raise NotImplementedError("override the 'backend' fixture to return a new attention backend")

    @pytest.fixture
    def device(self) -> torch.device:
        return torch.device("cpu")

    @pytest.fixture
    def refused(self) -> list[tuple[torch.device, torch.dtype]]:
        """(device, cache dtype) pairs the backend cannot run on: ``configure`` must refuse each."""
        return []

    # ------------------------------------------------------------------ the problem

    def step(self, mix: list[tuple[int, int]], seed: int) -> StepLayout:
        """A step over ``mix``, each sequence's blocks drawn at random from the pool (block 0 never: padding)."""
        rng = random.Random(seed)
        free = rng.sample(range(1, self.num_blocks), self.num_blocks - 1)
        sequences = []
        for seq_id, (cached, new) in enumerate(mix):
            needed = -(-(cached + new) // self.block_size)
            sequences.append(scheduled(seq_id, cached, new, [free.pop() for _ in range(needed)]))
        return layout(ExecutionBatch(sequences=sequences, block_size=self.block_size))

    def caches(self, step: StepLayout, device: torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Poisoned caches holding random keys/values at every position of every context (this step's included)."""
        generator = torch.Generator().manual_seed(seed)
        shape = (self.num_blocks, self.block_size, self.num_kv_heads, self.head_size)
        k_cache, v_cache = torch.full(shape, POISON), torch.full(shape, -POISON)
        for seq, length in zip(step.sequences, step.context_lens, strict=True):
            positions = torch.arange(int(length))
            blocks = torch.tensor(seq.block_table)[positions // self.block_size]
            offsets = positions % self.block_size
            k_cache[blocks, offsets] = torch.randn(int(length), self.num_kv_heads, self.head_size, generator=generator)
            v_cache[blocks, offsets] = torch.randn(int(length), self.num_kv_heads, self.head_size, generator=generator)
        return k_cache.to(device, self.dtype), v_cache.to(device, self.dtype)

    def queries(self, step: StepLayout, device: torch.device, seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed + 1)
        return torch.randn(len(step.input_ids), self.num_heads, self.head_size, generator=generator).to(
            device, self.dtype
        )

    def fresh(self, step: StepLayout, cache: torch.Tensor) -> torch.Tensor:
        """This step's keys (or values), ``[T, kv_heads, head_size]``, read back from their slots."""
        slots = torch.from_numpy(step.slot_mapping).to(cache.device)
        return cache.view(-1, self.num_kv_heads, self.head_size).index_select(0, slots)

    def reference(self, step: StepLayout, query, k_cache, v_cache, scale: float) -> torch.Tensor:
        """Plain attention: each sequence's context gathered token by token, causal over its new rows."""
        out = torch.empty(query.shape, dtype=torch.float32)
        group = self.num_heads // self.num_kv_heads
        for i, seq in enumerate(step.sequences):
            rows = slice(int(step.query_start[i]), int(step.query_start[i + 1]))
            length = int(step.context_lens[i])
            positions = torch.arange(length)
            blocks = torch.tensor(seq.block_table)[positions // self.block_size]
            keys = k_cache.cpu().float()[blocks, positions % self.block_size].repeat_interleave(group, dim=1)
            values = v_cache.cpu().float()[blocks, positions % self.block_size].repeat_interleave(group, dim=1)
            new = torch.arange(seq.start_position, seq.start_position + len(seq.token_ids))
            mask = positions[None, :] <= new[:, None]  # [new, context]
            q = query[rows].cpu().float().transpose(0, 1)  # [heads, new, head_size]
            attended = F.scaled_dot_product_attention(
                q, keys.transpose(0, 1), values.transpose(0, 1), attn_mask=mask, scale=scale
            )
            out[rows] = attended.transpose(0, 1)
        return out

    def attend(self, backend: AttentionBackend, step: StepLayout, device: torch.device, seed: int):
        """The backend's output for ``step``, and the reference's."""
        cache_dtype = backend.configure(device, self.dtype)
        assert cache_dtype == self.dtype, (
            f"configure changed the cache dtype {self.dtype} to {cache_dtype}: set the contract's dtype"
        )
        k_cache, v_cache = self.caches(step, device, seed)
        query = self.queries(step, device, seed)
        slot_mapping = torch.from_numpy(step.slot_mapping).to(device)
        inputs = backend.inputs(step, slot_mapping)
        scale = self.head_size**-0.5
        out = backend.attend(
            query, self.fresh(step, k_cache), self.fresh(step, v_cache), k_cache, v_cache, inputs, scale
        )
        return out, self.reference(step, query, k_cache, v_cache, scale)

    # ------------------------------------------------------------------ the checks

    def test_configure_keeps_a_supported_cache_dtype(self, backend, device) -> None:
        assert backend.configure(device, self.dtype) == self.dtype

    def test_configure_refuses_by_name_where_it_cannot_run(self, backend, refused) -> None:
        if not refused:
            pytest.skip("the 'refused' fixture names no combination this backend refuses")
        for device, dtype in refused:
            with pytest.raises(ConfigError) as raised:
                backend.configure(device, dtype)
            assert raised.value.param == "attention", f"configure({device}, {dtype}) refused without naming the option"

    def test_it_has_a_name_and_says_whether_it_supports_graphs(self, backend) -> None:
        assert isinstance(backend, AttentionBackend)
        assert isinstance(backend.name, str) and backend.name
        assert isinstance(backend.supports_graphs, bool)

    def test_inputs_carry_the_slot_mapping(self, backend, device) -> None:
        step = self.step(MIXES["mixed"], seed=0)
        backend.configure(device, self.dtype)
        slot_mapping = torch.from_numpy(step.slot_mapping).to(device)
        assert torch.equal(backend.inputs(step, slot_mapping).slot_mapping.cpu(), slot_mapping.cpu())

    @pytest.mark.parametrize("mix", sorted(MIXES))
    @pytest.mark.parametrize("seed", [0, 1])
    def test_attend_matches_plain_attention(self, backend, device, mix: str, seed: int) -> None:
        out, expected = self.attend(backend, self.step(MIXES[mix], seed), device, seed)
        assert out.shape == expected.shape and out.dtype == self.dtype
        torch.testing.assert_close(out.cpu().float(), expected, **self.tolerance)

    def test_graph_inputs_give_the_eager_outputs(self, backend, device) -> None:
        """A decode-only step from static buffers wider than its tables (padded with block 0) attends as eagerly."""
        if not backend.supports_graphs:
            pytest.skip("the backend does not support decode graphs")
        step = self.step(MIXES["decodes"], seed=2)
        eager, expected = self.attend(backend, step, device, seed=2)
        k_cache, v_cache = self.caches(step, device, seed=2)
        query = self.queries(step, device, seed=2)
        width = -(-int(step.context_lens.max()) // self.block_size) + 2
        tables = torch.from_numpy(step.block_tables(0, step.num_decodes, width=width)).to(device)
        lengths = torch.from_numpy(step.context_lens).to(device)
        slot_mapping = torch.from_numpy(step.slot_mapping).to(device)
        inputs = backend.graph_inputs(slot_mapping, tables, lengths, self.block_size)
        scale = self.head_size**-0.5
        out = backend.attend(
            query, self.fresh(step, k_cache), self.fresh(step, v_cache), k_cache, v_cache, inputs, scale
        )
        torch.testing.assert_close(out.cpu().float(), expected, **self.tolerance)
        torch.testing.assert_close(out, eager, **self.tolerance)
