"""Decode steps replayed from captured graphs instead of launched op by op.

A decode step launches a few hundred small kernels; at small batches the
launches, not the GPU, set the pace. A CUDA graph records them once and
replays them with one call. A graph is fixed: its shapes and every memory
address it touches. So each graph serves one (batch size, block-table
width) bucket and reads its inputs from static buffers that every step
refills:

- a step of ``n`` decodes runs the graph of the smallest batch bucket
  ``>= n`` (1, 2, 4, 8, then multiples of 8); the padding rows decode token
  0 at position 0 into a scratch block that no sequence owns, so they write
  and read nothing real;
- the block-table width is the smallest power of two of blocks covering the
  longest context (attention costs grow with the width);
- the final hidden states land in one static buffer; the head's matmul and
  sampling run after the replay, outside the graph.

Graphs are captured the first time their bucket is needed and kept, with
the steps they recorded (a graph reads and writes the tensors its step
holds, so those must live as long as it does); captures share one memory
pool and one stream (graphs never run concurrently). A capture
that fails raises :class:`GraphCaptureError`; the executor then turns graphs
off and runs decode steps eagerly (a capture writes only what the step
itself writes, so rerunning the step is safe).

What a graph cannot hold is refused at capture with the op's name: reading
tensor values on the host (``item``, ``tolist``, ``bool``), ops whose output
shape depends on values (``nonzero``, ``unique``), tensors built from host
data. On the CPU, where torch has no graphs, :class:`CheckedReplay` stands
in: the same buffers, buckets and checks, with the step re-run eagerly at
each replay. That is how the graph path is tested without a GPU.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from hetero_core.logs import get_logger
from hetero_core.step_layout import StepLayout
from hetero_executor_torch.attention_backend import AttentionBackend
from hetero_executor_torch.model import LlamaModel

log = get_logger(__name__)

Replay = Callable[[], None]
Capture = Callable[[Callable[[], None]], Replay]

NOT_CAPTURABLE = {
    torch.Tensor.item: "reads a value on the host",
    torch.Tensor.tolist: "reads values on the host",
    torch.Tensor.__bool__: "branches on a tensor value",
    torch.Tensor.__int__: "reads a value on the host",
    torch.Tensor.__float__: "reads a value on the host",
    torch.Tensor.__index__: "reads a value on the host",
    torch.Tensor.cpu: "copies to the host",
    torch.Tensor.nonzero: "has a value-dependent shape",
    torch.nonzero: "has a value-dependent shape",
    torch.unique: "has a value-dependent shape",
    torch.masked_select: "has a value-dependent shape",
    torch.tensor: "builds a tensor from host data",
    torch.as_tensor: "builds a tensor from host data",
}


class NotCapturableError(RuntimeError):
    """A step did something a captured graph cannot replay."""


class GraphCaptureError(RuntimeError):
    """Capturing a decode graph failed; the step's inputs are intact, so it can be run eagerly."""


class CaptureGuard(TorchFunctionMode):
    """Raises :class:`NotCapturableError` on the ops in ``NOT_CAPTURABLE``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        reason = NOT_CAPTURABLE.get(func)
        if reason is not None:
            raise NotCapturableError(
                f"a captured decode step cannot call {getattr(func, '__name__', func)}: it {reason}"
            )
        return func(*args, **(kwargs or {}))


class CudaGraphCapture:
    """Records a step into a ``torch.cuda.CUDAGraph``; every graph of one executor shares a memory pool
    and a capture stream. Called with ``device`` current (the executor's steps run under it)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def __call__(self, step: Callable[[], None]) -> Replay:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        try:
            with torch.cuda.stream(self.stream), CaptureGuard():
                step()  # first launches compile kernels and allocate workspaces, which a capture must not do
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream), CaptureGuard():
                step()
        finally:
            torch.cuda.set_stream(current)  # a failed capture can leave the capture stream current
            current.wait_stream(self.stream)
        return graph.replay


class CheckedReplay:
    """The CPU stand-in for :class:`CudaGraphCapture`: checks the step at capture, re-runs it at replay."""

    def __call__(self, step: Callable[[], None]) -> Replay:
        with CaptureGuard():
            step()
        return step


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 8, up to ``max_batch`` (included)."""
    buckets = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8))
    return buckets + [max_batch]


def width_buckets(max_blocks: int) -> list[int]:
    """Powers of two of blocks, up to ``max_blocks`` (included)."""
    buckets = []
    width = 1
    while width < max_blocks:
        buckets.append(width)
        width *= 2
    return buckets + [max_blocks]


def smallest_at_least(buckets: Sequence[int], value: int) -> int:
    return next(b for b in buckets if b >= value)


class DecodeGraphs:
    """Replays decode-only steps of up to ``max_batch`` sequences from graphs, one per bucket.

    ``scratch_block`` is a cache block the allocator never hands out: the
    padding rows' keys and values go there.
    """

    def __init__(
        self,
        model: LlamaModel,
        attention: AttentionBackend,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        scratch_block: int,
        max_batch: int,
        max_model_len: int,
        capture: Capture,
    ) -> None:
        self.model = model
        self.attention = attention
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.capture = capture
        self.batch_buckets = batch_buckets(max_batch)
        self.width_buckets = width_buckets(-(-max_model_len // block_size))
        # Each graph with the step it recorded: the graph reads and writes the tensors the step holds.
        self.graphs: dict[tuple[int, int], tuple[Replay, Callable[[], None]]] = {}
        device = model.device
        rows, width = self.batch_buckets[-1], self.width_buckets[-1]
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.zeros(rows, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(
            rows * width, dtype=torch.int32, device=device
        )  # viewed [rows, width] per bucket
        self.context_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.hidden = torch.zeros(rows, model.config.hidden_size, dtype=model.dtype, device=device)

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    def can_run(self, step: StepLayout) -> bool:
        """Whether ``step`` is sampled decodes only and fits the largest bucket."""
        num_seqs = len(step.sequences)
        return 0 < num_seqs == step.num_decodes <= self.batch_buckets[-1] and all(s.do_sample for s in step.sequences)

    def run(self, step: StepLayout) -> torch.Tensor:
        """The final (normed) hidden states of the step's decode tokens, ``[num_decodes, hidden]``."""
        num_seqs = step.num_decodes
        rows = smallest_at_least(self.batch_buckets, num_seqs)
        width = smallest_at_least(self.width_buckets, -(-int(step.context_lens.max()) // self.block_size))
        self._fill(step, rows, width)
        key = (rows, width)
        if key not in self.graphs:
            started = time.perf_counter()
            step = self._step(rows, width)
            try:
                self.graphs[key] = (self.capture(step), step)
            except Exception as exc:
                raise GraphCaptureError(
                    f"capturing the decode graph for batch {rows} x {width} blocks failed: {exc}"
                ) from exc
            log.debug(
                "decode graph captured", batch=rows, blocks=width, seconds=round(time.perf_counter() - started, 3)
            )
        replay, _ = self.graphs[key]
        replay()
        return self.hidden[:num_seqs]

    def _fill(self, step: StepLayout, rows: int, width: int) -> None:
        """Write this step's inputs, padded to ``rows`` x ``width``, into the static buffers."""
        n, scratch = step.num_decodes, self.scratch_block
        tokens = np.zeros((3, rows), dtype=np.int64)  # input ids, positions, slots
        tokens[:, :n] = step.input_ids, step.positions, step.slot_mapping
        tokens[2, n:] = scratch * self.block_size
        tables = step.block_tables(0, n, pad=scratch, width=width)
        if rows > n:
            tables = np.concatenate([tables, np.full((rows - n, width), scratch, dtype=np.int32)])
        context_lens = np.ones(rows, dtype=np.int32)
        context_lens[:n] = step.context_lens
        host = torch.from_numpy(tokens)
        self.input_ids[:rows].copy_(host[0], non_blocking=True)
        self.positions[:rows].copy_(host[1], non_blocking=True)
        self.slot_mapping[:rows].copy_(host[2], non_blocking=True)
        self._tables(rows, width).copy_(torch.from_numpy(tables), non_blocking=True)
        self.context_lens[:rows].copy_(torch.from_numpy(context_lens), non_blocking=True)

    def _tables(self, rows: int, width: int) -> torch.Tensor:
        """A contiguous ``[rows, width]`` view of the block-table buffer (the kernels want contiguous tables)."""
        return self.block_tables[: rows * width].view(rows, width)

    def _step(self, rows: int, width: int) -> Callable[[], None]:
        """The step a graph records: every tensor it touches is a view of a static buffer or the cache, or is
        made from them inside the step by the attention backend's ``graph_inputs``."""
        model, kv_caches = self.model, self.kv_caches
        input_ids, positions, slot_mapping = self.input_ids[:rows], self.positions[:rows], self.slot_mapping[:rows]
        tables, context_lens, hidden = self._tables(rows, width), self.context_lens[:rows], self.hidden[:rows]
        backend, block_size = self.attention, self.block_size

        def step() -> None:
            attention = backend.graph_inputs(slot_mapping, tables, context_lens, block_size)
            hidden.copy_(model.rms_norm(model.hidden_states(input_ids, positions, attention, kv_caches), model.norm))

        return step
