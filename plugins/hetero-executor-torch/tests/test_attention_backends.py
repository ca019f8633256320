"""The attention-backend seam: a third-party backend plugs in by entry point or as an object, and gives the same tokens."""

from __future__ import annotations

import pytest
import torch

from hetero_core.params import GenerationParams
from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_executor_torch import TorchExecutor, attention_backend
from hetero_executor_torch.attention import TorchAttention
from hetero_executor_torch.attention_backend import AttentionBackend

from .conftest import tiny_engine

PROMPTS = ["The first prompt", "a second, longer prompt that spans several blocks", "x"]
PARAMS = GenerationParams(temperature=0.0, max_tokens=12, ignore_eos=True)


class CountingAttention:
    """The README's minimal backend: the plain torch path, counting the steps and layer calls it serves."""

    name = "counting"

    def __init__(self, supports_graphs: bool = True) -> None:
        self.plain = TorchAttention()
        self.supports_graphs = supports_graphs
        self.steps = 0
        self.calls = 0

    def configure(self, device, kv_cache_dtype):
        return self.plain.configure(device, kv_cache_dtype)

    def inputs(self, step, slot_mapping):
        self.steps += 1
        return self.plain.inputs(step, slot_mapping)

    def graph_inputs(self, slot_mapping, block_tables, context_lens, block_size):
        return self.plain.graph_inputs(slot_mapping, block_tables, context_lens, block_size)

    def attend(self, query, key, value, k_cache, v_cache, inputs, scale):
        self.calls += 1
        return self.plain.attend(query, key, value, k_cache, v_cache, inputs, scale)


class EntryPoint:
    """What ``importlib.metadata.entry_points`` yields for a ``[project.entry-points."hetero_infer.attention"]`` line."""

    def __init__(self, name, factory):
        self.name, self.factory = name, factory

    def load(self):
        return self.factory


def tokens(engine) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in engine.generate(PROMPTS, PARAMS)]


@pytest.fixture(scope="module")
def plain_tokens(tiny_model):
    return tokens(tiny_engine(tiny_model, max_total_tokens=7))


def registered(monkeypatch, factory) -> None:
    points = [EntryPoint("counting", factory)]
    monkeypatch.setattr(attention_backend, "entry_points", lambda group: points if group == attention_backend.ENTRY_POINT_GROUP else [])


@pytest.mark.parametrize("decode_graphs", [False, True], ids=["eager", "graphs"])
def test_an_entry_point_backend_gives_the_plain_tokens(tiny_model, plain_tokens, monkeypatch, decode_graphs) -> None:
    backends = []
    registered(monkeypatch, lambda: backends.append(CountingAttention()) or backends[-1])
    engine = tiny_engine(tiny_model, max_total_tokens=7, executor={"name": "torch", "dtype": "float32", "attention": "counting", "decode_graphs": decode_graphs})
    assert tokens(engine) == plain_tokens
    (backend,) = backends
    assert backend.steps > 0 and backend.calls >= backend.steps * engine.executor.model_config.num_layers
    assert (engine.executor.graphs is not None and engine.executor.graphs.num_graphs > 0) == decode_graphs


def test_a_backend_object_gives_the_plain_tokens(tiny_model, plain_tokens) -> None:
    backend = CountingAttention()
    engine = tiny_engine(tiny_model, max_total_tokens=7, executor={"name": "torch", "dtype": "float32", "attention": backend})
    assert isinstance(backend, AttentionBackend)
    assert tokens(engine) == plain_tokens
    assert backend.calls > 0


def test_an_unknown_name_lists_the_backends(tiny_model, monkeypatch) -> None:
    registered(monkeypatch, CountingAttention)
    with pytest.raises(ConfigError, match="counting, numba, torch; got 'flash'") as raised:
        TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", attention="flash")
    assert raised.value.param == "attention"


def test_an_object_that_is_no_backend_is_refused(tiny_model) -> None:
    with pytest.raises(ConfigError, match="AttentionBackend"):
        TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", attention=object())


def test_graphs_are_refused_by_name_for_a_backend_without_them(tiny_model) -> None:
    with pytest.raises(ConfigError, match="'counting' does not support decode graphs") as raised:
        TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", decode_graphs=True, attention=CountingAttention(supports_graphs=False))
    assert raised.value.param == "decode_graphs"
    executor = TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", decode_graphs="auto", attention=CountingAttention(supports_graphs=False))
    assert not executor.uses_graphs


def test_auto_picks_the_numba_kernel_on_the_cpu_and_torch_without_the_kernels(tiny_model, monkeypatch) -> None:
    executor = TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="bfloat16", device="cpu")
    assert executor.attention.name == "numba"
    assert executor.kv_cache_dtype == torch.bfloat16  # read in place, not widened to float32
    monkeypatch.setattr(attention_backend, "_kernels_installed", lambda: False)
    assert TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="bfloat16", device="cpu").attention.name == "torch"
