"""Decode steps replayed from graphs: same tokens as eager steps, padding that touches nothing real,
and refusal of what a CUDA graph cannot hold. On the CPU the graphs are the checked eager stand-in."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from hetero_core.batch import ExecutionBatch, ScheduledSequence
from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.params import GenerationParams
from hetero_executor_torch import TorchExecutor
from hetero_executor_torch.graphs import CheckedReplay, NotCapturableError, batch_buckets, width_buckets

from .conftest import tiny_engine

PROMPTS = [
    "The first prompt",
    "a second, longer prompt that spans several blocks",
    "x",
    "The first prompt again",
    "yy" * 30,
]
GREEDY = GenerationParams(temperature=0.0, max_tokens=30, ignore_eos=True)
SEEDED = GenerationParams(temperature=0.9, top_p=0.9, max_tokens=30, ignore_eos=True, seed=7, n=2)
DEVICE = {
    "torch": "auto",
    "numba": "cpu",
}  # the numba backend is the CPU kernel; torch's runs on CUDA where there is one


def test_buckets() -> None:
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert batch_buckets(32) == [1, 2, 4, 8, 16, 24, 32]
    assert width_buckets(1) == [1]
    assert width_buckets(5) == [1, 2, 4, 5]
    assert width_buckets(8) == [1, 2, 4, 8]


def generated(engine, params: GenerationParams) -> list[list[list[int]]]:
    return [[o.token_ids for o in r.outputs] for r in engine.generate(PROMPTS, params)]


@pytest.fixture(scope="module")
def eager(tiny_model):
    """The eager steps' tokens on each device (seeded samples differ between CPU and CUDA)."""
    runs = {}

    def on(device: str) -> dict:
        if device not in runs:
            engine = tiny_engine(tiny_model, executor={"name": "torch", "dtype": "float32", "device": device})
            runs[device] = {"greedy": generated(engine, GREEDY), "seeded": generated(engine, SEEDED)}
        return runs[device]

    return on


@pytest.mark.parametrize("attention", list(DEVICE))
@pytest.mark.parametrize(
    "overrides",
    [{}, {"max_total_tokens": 7}, {"max_num_blocks": 24, "max_model_len": 96}, {"max_batch_size": 3}],
    ids=["batched", "chunked", "preempting", "odd-batch-bucket"],
)
def test_graph_decodes_give_the_eager_tokens(tiny_model, eager, attention: str, overrides: dict) -> None:
    device = DEVICE[attention]
    engine = tiny_engine(
        tiny_model,
        executor={"name": "torch", "dtype": "float32", "device": device, "decode_graphs": True, "attention": attention},
        **overrides,
    )
    assert generated(engine, GREEDY) == eager(device)["greedy"]
    assert generated(engine, SEEDED) == eager(device)["seeded"]
    graphs = engine.executor.graphs
    assert 0 < graphs.num_graphs <= len(graphs.batch_buckets) * len(graphs.width_buckets)
    assert engine.get_memory_stats().used_blocks == 0


def decode(seq_id: int, token: int, position: int, table: list[int]) -> ScheduledSequence:
    tokens = [1] * position + [token]
    return ScheduledSequence(seq_id, [token], position, table, True, GREEDY, tokens, position, None)


def test_padding_rows_write_only_the_scratch_block(tiny_model) -> None:
    executor = TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", decode_graphs=True)
    executor.initialize_cache(num_blocks=12, block_size=4)
    generator = torch.Generator().manual_seed(0)
    for k_cache, v_cache in executor.kv_caches:
        k_cache.copy_(torch.randn(k_cache.shape, generator=generator))
        v_cache.copy_(torch.randn(v_cache.shape, generator=generator))
    before = [(k.clone(), v.clone()) for k, v in executor.kv_caches]
    seqs = [decode(0, 5, 6, [3, 7]), decode(1, 9, 1, [10]), decode(2, 4, 9, [0, 1, 2])]  # 3 rows, padded to 4
    executor.execute(ExecutionBatch(seqs, 4))
    written = {(7, 2), (10, 1), (2, 1)}  # (block, offset) of each decode's new token
    scratch = 12
    for (k, v), (k0, v0) in zip(executor.kv_caches, before, strict=True):
        for cache, old in ((k, k0), (v, v0)):
            changed = {(b, o) for b, o in (cache != old).any(dim=(2, 3)).nonzero().tolist()}
            assert changed - {(scratch, o) for o in range(4)} == written
    assert list(executor.graphs.graphs) == [(4, 4)]


def test_captured_steps_live_as_long_as_their_graphs(tiny_model) -> None:
    """A CUDA graph's replay holds only the graph, not the tensors the step allocated for it."""
    executor = TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", decode_graphs=True)
    executor.initialize_cache(num_blocks=12, block_size=4)
    recorded = []

    def capture_keeping_nothing(step):
        CheckedReplay()(step)
        recorded.append(weakref.ref(step))
        return lambda: None

    executor.graphs.capture = capture_keeping_nothing
    executor.execute(ExecutionBatch([decode(0, 5, 6, [3, 7])], 4))
    gc.collect()
    assert len(recorded) == 1 and recorded[0]() is not None


def test_capture_refuses_host_reads_and_host_data() -> None:
    values = torch.arange(4.0)
    with pytest.raises(NotCapturableError, match="item"):
        CheckedReplay()(lambda: values.sum().item())
    with pytest.raises(NotCapturableError, match="tensor"):
        CheckedReplay()(lambda: values + torch.tensor([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(NotCapturableError, match="__bool__"):
        CheckedReplay()(lambda: values.add_(1) if values.max() > 2 else None)


def test_decode_graphs_option_is_validated(tiny_model) -> None:
    with pytest.raises(ConfigError, match="decode_graphs"):
        TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", decode_graphs="sometimes")


def test_a_failed_capture_turns_graphs_off_and_the_step_still_runs(tiny_model, eager) -> None:
    engine = tiny_engine(tiny_model, executor={"name": "torch", "dtype": "float32", "decode_graphs": True})
    executor = engine.executor

    def failing_capture(step):
        raise RuntimeError("operation not permitted when stream is capturing")

    executor.graphs.graphs.clear()
    executor.graphs.capture = failing_capture
    assert generated(engine, GREEDY) == eager("auto")["greedy"]
    assert executor.graphs is None
