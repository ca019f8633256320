"""Paged attention in plain torch: per-step index tensors, then one call per layer.

The batch is flattened with decode tokens first. Decodes, sorted by
context length and split in up to two groups of similar length, share one
scaled-dot-product call per group over their contexts gathered block by
block through the block tables (padded to the group's longest, masked); each prefill chunk gets its own
call, causal over its cached and new tokens. A chunk with nothing cached
attends to its own fresh keys and values directly, without a gather.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from hetero_core.step_layout import StepLayout

MIN_DECODES_TO_SPLIT = 8  # below this, one attention call costs less than two


@attrs.define
class PrefillSpan:
    start: int  # first token of the chunk in the flattened batch
    length: int  # tokens in the chunk
    context_len: int  # cached + new tokens it attends to
    blocks: torch.Tensor | None  # the block table covering the context; None when nothing is cached
    mask: torch.Tensor | None  # [length, context_len] causal mask over cached + new tokens


@attrs.define
class DecodeGroup:
    """Decodes of similar context length, attended in one call (less padding than one call for all)."""

    start: int  # first decode of the group in the flattened batch
    count: int
    blocks: torch.Tensor  # [count, max_blocks] block tables (padding -> block 0)
    mask: torch.Tensor  # [count, 1, 1, max_blocks * block_size], True = attend


@attrs.define
class KernelInputs:
    """Step metadata for kernels that read the paged cache in place (int32 tensors on the cache's device)."""

    decode_tables: torch.Tensor  # [num_decodes, max_blocks]
    decode_lens: torch.Tensor  # [num_decodes] cached tokens each decode attends to (its own included)
    prefill_tables: torch.Tensor  # [num_prefills, max_blocks]
    prefill_query_start: torch.Tensor  # [num_prefills + 1] offsets of each chunk among the prefill tokens
    prefill_context_lens: torch.Tensor  # [num_prefills] cached + new tokens of each chunk


@attrs.define
class AttentionInputs:
    """Everything attention needs for one step, built once and shared by every layer."""

    slot_mapping: torch.Tensor  # [T] where each new token's key/value is written
    num_decodes: int
    decode_groups: list[DecodeGroup]
    prefills: list[PrefillSpan]
    kernel: KernelInputs | None = None  # set when a kernel backend serves attention


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor
) -> None:
    """Store the step's new keys/values ([T, kv_heads, head_size]) in their cache slots."""
    kv_heads, head_size = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, head_size).index_copy_(0, slots, key.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_size).index_copy_(0, slots, value.to(v_cache.dtype))


def gather_blocks(cache: torch.Tensor, tables: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The cache blocks named by ``tables`` [rows, blocks], as [rows, blocks * block_size, kv_heads, head_size].

    Whole blocks are copied (contiguous runs of block_size tokens), which is
    far cheaper than gathering token by token.
    """
    rows, blocks = tables.shape
    gathered = cache.index_select(0, tables.reshape(-1))
    return gathered.view(rows, blocks * cache.shape[1], *cache.shape[2:]).to(dtype)


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    inputs: AttentionInputs,
    scale: float,
) -> torch.Tensor:
    """Attention output [T, heads, head_size] for query [T, heads, head_size];
    the cache already holds this step's keys."""
    out = torch.empty_like(query)
    for group in inputs.decode_groups:
        out[group.start : group.start + group.count] = decode_attention(query, k_cache, v_cache, group, scale)
    prefill_attention(out, query, key, value, k_cache, v_cache, inputs, scale)
    return out


def decode_attention(query, k_cache, v_cache, group: DecodeGroup, scale: float) -> torch.Tensor:
    """A decode group's outputs [count, heads, head_size]: one masked call over their gathered blocks.

    On the CPU the call runs in float32: torch's CPU kernel for one masked
    query token is several times slower in bfloat16 than in float32, gather
    and casts included (figures in ``docs/design/2026-11-26-cpu-attention-kernels.md``).
    """
    dtype = torch.float32 if query.device.type == "cpu" else query.dtype
    keys = gather_blocks(k_cache, group.blocks, dtype).transpose(1, 2)  # [count, kv_heads, L, head_size]
    values = gather_blocks(v_cache, group.blocks, dtype).transpose(1, 2)
    q = query[group.start : group.start + group.count].unsqueeze(2).to(dtype)  # [count, heads, 1, head_size]
    gqa = query.shape[1] != k_cache.shape[2]
    return (
        F.scaled_dot_product_attention(q, keys, values, attn_mask=group.mask, scale=scale, enable_gqa=gqa)
        .squeeze(2)
        .to(query.dtype)
    )


def prefill_attention(out, query, key, value, k_cache, v_cache, inputs: AttentionInputs, scale: float) -> None:
    """Fill ``out``'s prefill rows: each chunk causal over its cached and new tokens."""
    gqa = query.shape[1] != k_cache.shape[2]
    for span in inputs.prefills:
        rows = slice(span.start, span.start + span.length)
        q = query[rows].transpose(0, 1).unsqueeze(0)  # [1, heads, length, head_size]
        if span.blocks is None:
            keys = key[rows].transpose(0, 1).unsqueeze(0)
            values = value[rows].transpose(0, 1).unsqueeze(0)
            attended = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            keys = gather_blocks(k_cache, span.blocks[None], query.dtype)[:, : span.context_len].transpose(1, 2)
            values = gather_blocks(v_cache, span.blocks[None], query.dtype)[:, : span.context_len].transpose(1, 2)
            attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=span.mask, scale=scale, enable_gqa=gqa)
        out[rows] = attended.squeeze(0).transpose(0, 1)


def decode_groups(step: StepLayout, device: torch.device) -> list[DecodeGroup]:
    """Split the length-sorted decodes in two when there are enough: padding each half only to its own
    longest context costs less attention than padding all of them to the longest."""
    n = step.num_decodes
    halves = [(0, n)] if n < MIN_DECODES_TO_SPLIT else [(0, n // 2), (n // 2, n)]
    groups = []
    for start, stop in halves:
        if start == stop:
            continue
        table = torch.from_numpy(step.block_tables(start, stop))
        lengths = torch.from_numpy(step.context_lens[start:stop])
        mask = (torch.arange(table.shape[1] * step.block_size)[None, :] < lengths[:, None])[:, None, None, :]
        groups.append(DecodeGroup(start, stop - start, table.to(device), mask.to(device)))
    return groups


def prefill_spans(step: StepLayout, device: torch.device) -> list[PrefillSpan]:
    spans = []
    for i in range(step.num_decodes, len(step.sequences)):
        cached = step.sequences[i].start_position
        start, length, context = int(step.query_start[i]), len(step.sequences[i].token_ids), int(step.context_lens[i])
        if cached == 0:
            spans.append(PrefillSpan(start, length, context, None, None))
        else:
            table = torch.from_numpy(step.block_tables(i, i + 1)[0]).to(device)
            causal = torch.arange(context)[None, :] <= (cached + torch.arange(length))[:, None]
            spans.append(PrefillSpan(start, length, context, table, causal.to(device)))
    return spans


def torch_inputs(step: StepLayout, slot_mapping: torch.Tensor) -> AttentionInputs:
    """The plain path's inputs: masks and block tables per decode group and per prefill chunk."""
    device = slot_mapping.device
    return AttentionInputs(slot_mapping, step.num_decodes, decode_groups(step, device), prefill_spans(step, device))


class TorchAttention:
    """The ``torch`` attention backend: gather the blocks, then scaled-dot-product attention. Any device,
    any cache dtype."""

    name = "torch"
    supports_graphs = True

    def configure(self, device: torch.device, kv_cache_dtype: torch.dtype) -> torch.dtype:
        return kv_cache_dtype

    def inputs(self, step: StepLayout, slot_mapping: torch.Tensor) -> AttentionInputs:
        return torch_inputs(step, slot_mapping)

    def graph_inputs(self, slot_mapping, block_tables, context_lens, block_size: int) -> AttentionInputs:
        rows, width = block_tables.shape
        span = torch.arange(width * block_size, device=block_tables.device)[None, :]
        mask = (span < context_lens[:, None])[:, None, None, :]
        return AttentionInputs(slot_mapping, rows, [DecodeGroup(0, rows, block_tables, mask)], [])

    def attend(self, query, key, value, k_cache, v_cache, inputs: AttentionInputs, scale: float) -> torch.Tensor:
        return paged_attention(query, key, value, k_cache, v_cache, inputs, scale)
