"""The attention-backend seam: a third-party backend plugs in through the plugin hook or as an object,
and gives the same tokens; its plugin is disabled, reported broken and listed like any other."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.hookspecs import hookimpl
from hetero_core.params import GenerationParams
from hetero_core.plugins import create_plugin_manager, describe_plugins
from hetero_executor_torch import AttentionBackend, AttentionBackends, TorchAttention, TorchExecutor
from hetero_executor_torch.attention_backend import resolve

from .conftest import tiny_engine

PROMPTS = ["The first prompt", "a second, longer prompt that spans several blocks", "x"]
PARAMS = GenerationParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PLUGIN = "counting_attention_plugin"


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


class BackendPlugin:
    """An inline plugin registering ``factories`` as attention backends (by name)."""

    def __init__(self, **factories) -> None:
        self.factories = factories

    @hookimpl
    def register_attention_backends(self, register) -> None:
        for name, factory in self.factories.items():
            register(name, factory)


def with_torch_plugin(*plugins: tuple[object, str], **kwargs):
    """A plugin manager without entry points: the torch plugin (which adds the hook), then ``plugins``."""
    from hetero_executor_torch import plugin as torch_plugin

    pm = create_plugin_manager(entry_points=False, **kwargs)
    pm.register(torch_plugin, name="torch")
    for plugin, name in plugins:
        pm.register(plugin, name=name)
    return pm


def tokens(engine) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in engine.generate(PROMPTS, PARAMS)]


@pytest.fixture(scope="module")
def plain_tokens(tiny_model):
    return tokens(tiny_engine(tiny_model, max_total_tokens=7))


def loadable(monkeypatch, factory) -> None:
    """A plugin module named ``PLUGIN`` that ``plugins.load`` can name, registering ``counting``."""
    module = types.ModuleType(PLUGIN)
    module.register_attention_backends = BackendPlugin(counting=factory).register_attention_backends
    monkeypatch.setitem(sys.modules, PLUGIN, module)


@pytest.mark.parametrize("decode_graphs", [False, True], ids=["eager", "graphs"])
def test_a_plugin_backend_gives_the_plain_tokens(tiny_model, plain_tokens, monkeypatch, decode_graphs) -> None:
    backends = []
    loadable(monkeypatch, lambda: backends.append(CountingAttention()) or backends[-1])
    engine = tiny_engine(
        tiny_model,
        max_total_tokens=7,
        plugins={"load": [PLUGIN]},
        executor={"name": "torch", "dtype": "float32", "attention": "counting", "decode_graphs": decode_graphs},
    )
    assert tokens(engine) == plain_tokens
    (backend,) = backends
    assert backend.steps > 0 and backend.calls >= backend.steps * engine.executor.model_config.num_layers
    assert (engine.executor.graphs is not None and engine.executor.graphs.num_graphs > 0) == decode_graphs


def test_a_backend_object_gives_the_plain_tokens(tiny_model, plain_tokens) -> None:
    backend = CountingAttention()
    engine = tiny_engine(
        tiny_model, max_total_tokens=7, executor={"name": "torch", "dtype": "float32", "attention": backend}
    )
    assert isinstance(backend, AttentionBackend)
    assert tokens(engine) == plain_tokens
    assert backend.calls > 0


def test_an_unknown_name_lists_the_backends(tiny_model, monkeypatch) -> None:
    loadable(monkeypatch, CountingAttention)
    config = EngineConfig.from_mapping({"model": str(tiny_model), "plugins": {"load": [PLUGIN]}})
    with pytest.raises(
        ConfigError, match="must be one of auto, counting, numba, (numba-cuda, )?torch; got 'flash'"
    ) as raised:
        tiny_engine(tiny_model, plugins={"load": [PLUGIN]}, executor={"name": "torch", "attention": "flash"})
    assert raised.value.param == "attention"
    assert AttentionBackends.for_config(config).plugin("counting") == PLUGIN


def test_the_built_in_backends_register_through_the_hook() -> None:
    backends = AttentionBackends(with_torch_plugin())
    assert backends.names() == ["numba", "torch"] and {backends.plugin(n) for n in backends.names()} == {"torch"}
    assert resolve("auto", torch.device("cpu"), backends).name == "numba"
    assert resolve("auto", torch.device("cuda"), backends).name == "torch"  # resolving builds no tensor
    assert (
        AttentionBackends(create_plugin_manager(entry_points=False)).names() == []
    )  # no torch plugin: no hook, no names


def test_a_name_registered_twice_names_both_plugins() -> None:
    with pytest.raises(ConfigError, match="'torch' is registered twice: by plugin 'torch' and by plugin 'copycat'"):
        AttentionBackends(with_torch_plugin((BackendPlugin(torch=TorchAttention), "copycat")))


def test_a_plugin_whose_hook_raises_is_broken_and_listed_so() -> None:
    class Raising:
        @hookimpl
        def register_attention_backends(self, register) -> None:
            register("half", TorchAttention)
            raise RuntimeError("registration bug")

    pm = with_torch_plugin((Raising(), "raising"), (BackendPlugin(counting=CountingAttention), "counting"))
    backends = AttentionBackends(pm)
    assert backends.names() == ["counting", "numba", "torch"]
    assert pm.broken == {"raising": "its register_attention_backends hook raised RuntimeError: registration bug"}
    with pytest.raises(ConfigError, match="got 'half'; broken plugins, which may provide it: 'raising'"):
        backends.create("half")
    assert {"name": "raising", "broken": pm.broken["raising"]} in describe_plugins(pm)


def test_a_factory_that_fails_or_returns_no_backend_is_refused_naming_its_plugin() -> None:
    def failing():
        raise OSError("no device")

    backends = AttentionBackends(with_torch_plugin((BackendPlugin(failing=failing, nothing=object), "odd")))
    with pytest.raises(
        ConfigError, match=r"attention backend 'failing' \(plugin 'odd'\) failed to start: OSError: no device"
    ):
        backends.create("failing")
    with pytest.raises(
        ConfigError, match=r"'nothing' \(plugin 'odd'\) does not provide the AttentionBackend interface"
    ):
        backends.create("nothing")


@pytest.mark.integration  # the installed plugins, through their entry points
def test_the_installed_backends_are_listed_and_go_with_a_disabled_plugin() -> None:
    listing = {p["name"]: p for p in describe_plugins(create_plugin_manager())}
    assert listing["torch"]["components"]["attention_backend"] == {"numba": {}, "torch": {}}
    assert listing["numba-cuda"]["components"]["attention_backend"] == {"numba-cuda": {}}
    assert "numba-cuda" in AttentionBackends(create_plugin_manager()).names()
    backends = AttentionBackends(create_plugin_manager(disable=["numba-cuda"]))
    assert backends.names() == ["numba", "torch"]
    with pytest.raises(ConfigError, match="'numba-cuda' is provided by plugin 'numba-cuda', which is disabled"):
        backends.create("numba-cuda")


def test_an_object_that_is_no_backend_is_refused(tiny_model) -> None:
    with pytest.raises(ConfigError, match="AttentionBackend"):
        TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="float32", attention=object())


def test_graphs_are_refused_by_name_for_a_backend_without_them(tiny_model) -> None:
    with pytest.raises(ConfigError, match="'counting' does not support decode graphs") as raised:
        TorchExecutor(
            EngineConfig(model=str(tiny_model)),
            dtype="float32",
            decode_graphs=True,
            attention=CountingAttention(supports_graphs=False),
        )
    assert raised.value.param == "decode_graphs"
    executor = TorchExecutor(
        EngineConfig(model=str(tiny_model)),
        dtype="float32",
        decode_graphs="auto",
        attention=CountingAttention(supports_graphs=False),
    )
    assert not executor.uses_graphs


def test_auto_picks_the_numba_kernel_on_the_cpu(tiny_model) -> None:
    executor = TorchExecutor(EngineConfig(model=str(tiny_model)), dtype="bfloat16", device="cpu")
    assert executor.attention.name == "numba"
    assert executor.kv_cache_dtype == torch.bfloat16  # read in place, not widened to float32
