"""Serving backends are found through the register_serving_backends hook and used through one protocol."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.hookspecs import hookimpl
from hetero_core.metrics import EngineMetrics
from hetero_core.plugins import create_plugin_manager
from hetero_core.server.async_engine import AsyncEngine
from hetero_core.server.backend import ServingBackend, backend_name, create_backend
from hetero_core.server.command_bridge import CommandBridge
from hetero_core.server.metrics import ServerMetrics


class ReplicatedPlugin:
    """Registers a fake replicating backend that records how it was built."""

    @hookimpl
    def register_serving_backends(self, register) -> None:
        register("ray", lambda config, routing="prefix_affinity": ("ray", config.data_parallel_size, routing))


def manager(*plugins: object):
    pm = create_plugin_manager(entry_points=False)
    for number, plugin in enumerate(plugins):
        pm.register(plugin, name=f"inline-{number}")
    return pm


def test_the_built_ins_satisfy_the_protocol() -> None:
    local = create_backend(EngineConfig(), plugin_manager=manager())
    bridge = create_backend(EngineConfig.from_mapping({"server": {"backend": "command_bridge", "command": ["echo"]}}), plugin_manager=manager())
    assert isinstance(local, AsyncEngine) and isinstance(bridge, CommandBridge)
    assert isinstance(local, ServingBackend) and isinstance(bridge, ServingBackend)
    assert local.engine_metrics() == {} and local.max_model_len is None  # nothing loaded yet


def test_an_unknown_backend_lists_the_installed_ones() -> None:
    config = EngineConfig.from_mapping({"server": {"backend": "ssh"}})
    with pytest.raises(ConfigError, match="unknown serving_backend 'ssh'; installed: 'command_bridge', 'local_engine'"):
        create_backend(config, plugin_manager=manager())


def test_replicas_pick_the_data_parallel_backend_with_its_options() -> None:
    config = EngineConfig.from_mapping({"data_parallel_size": 3, "server": {"backend_options": {"routing": "least_loaded"}}})
    assert backend_name(config) == "ray"
    assert create_backend(config, plugin_manager=manager(ReplicatedPlugin())) == ("ray", 3, "least_loaded")


def test_replicas_without_the_plugin_say_what_is_missing() -> None:
    with pytest.raises(ConfigError, match="unknown serving_backend 'ray'"):
        create_backend(EngineConfig(data_parallel_size=2), plugin_manager=manager())


def test_backend_options_a_backend_does_not_take_are_refused_by_name() -> None:
    config = EngineConfig.from_mapping({"server": {"backend_options": {"routing": "random"}}})
    with pytest.raises(ConfigError, match="serving_backend 'local_engine' has no option 'routing'; accepted: none"):
        create_backend(config, plugin_manager=manager())


def test_a_bridge_cannot_be_replicated() -> None:
    config = EngineConfig.from_mapping({"data_parallel_size": 2, "server": {"backend": "command_bridge", "command": ["echo"]}})
    with pytest.raises(ConfigError, match="backend 'command_bridge' has no engine to replicate"):
        backend_name(config)


def test_replica_metrics_carry_a_replica_label_and_one_engine_none() -> None:
    replicas = {"0": EngineMetrics(generation_tokens=5), "1": EngineMetrics(generation_tokens=7)}
    text = generate_latest(ServerMetrics("m", lambda: replicas).registry).decode()
    assert 'vllm:generation_tokens_total{model_name="m",replica="0"} 5.0' in text
    assert 'vllm:generation_tokens_total{model_name="m",replica="1"} 7.0' in text
    assert 'vllm:request_success_total{finished_reason="stop",model_name="m",replica="1"} 0.0' in text
    single = generate_latest(ServerMetrics("m", lambda: {"": EngineMetrics(generation_tokens=2)}).registry).decode()
    assert 'vllm:generation_tokens_total{model_name="m"} 2.0' in single
