"""Serving backends are found through the register_serving_backends hook and used through one protocol."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client import generate_latest

from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.hookspecs import hookimpl
from hetero_core.metrics import EngineMetrics
from hetero_core.plugins import create_plugin_manager
from hetero_core.serving import ServingBackend
from hetero_serve_openai.app import create_app
from hetero_serve_openai.async_engine import AsyncEngine
from hetero_serve_openai.backend import backend_name, create_backend
from hetero_serve_openai.capabilities import BASELINE, CAPABILITIES
from hetero_serve_openai.command_bridge import CommandBridge
from hetero_serve_openai.metrics import ServerMetrics

from .conftest import SERVER_PLUGIN, RunningServer


class ReplicatedPlugin:
    """Registers a fake replicating backend that records how it was built."""

    @hookimpl
    def register_serving_backends(self, register) -> None:
        register("ray", lambda config, routing="prefix_affinity": ("ray", config.data_parallel_size, routing))


def manager(*plugins: object):
    pm = create_plugin_manager(entry_points=False, load=[SERVER_PLUGIN])
    for number, plugin in enumerate(plugins):
        pm.register(plugin, name=f"inline-{number}")
    return pm


def test_the_built_ins_satisfy_the_protocol() -> None:
    local = create_backend(EngineConfig(), plugin_manager=manager())
    bridge = create_backend(
        EngineConfig.from_mapping({"server": {"backend": "command_bridge", "command": ["echo"]}}),
        plugin_manager=manager(),
    )
    assert isinstance(local, AsyncEngine) and isinstance(bridge, CommandBridge)
    assert isinstance(local, ServingBackend) and isinstance(bridge, ServingBackend)
    assert local.engine_metrics() == {} and local.max_model_len is None  # nothing loaded yet


def test_an_unknown_backend_lists_the_installed_ones() -> None:
    config = EngineConfig.from_mapping({"server": {"backend": "ssh"}})
    with pytest.raises(ConfigError, match="unknown serving_backend 'ssh'; installed: 'command_bridge', 'local_engine'"):
        create_backend(config, plugin_manager=manager())


def test_replicas_pick_the_data_parallel_backend_with_its_options() -> None:
    config = EngineConfig.from_mapping(
        {"data_parallel_size": 3, "server": {"backend_options": {"routing": "least_loaded"}}}
    )
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
    config = EngineConfig.from_mapping(
        {"data_parallel_size": 2, "server": {"backend": "command_bridge", "command": ["echo"]}}
    )
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


THIRD_PARTY_BACKEND = '''
import asyncio

from hetero_core.hookspecs import hookimpl
from hetero_core.outputs import StreamDelta
from hetero_core.sequence import FinishReason


class Echo:
    """Answers each sample with its prompt and the seed; declares what it honours only when given."""

    error_status = 502
    error = None
    is_ready = True
    tokenizer = None
    max_model_len = None

    def __init__(self, capabilities=None):
        if capabilities is not None:
            self.capabilities = frozenset(capabilities)

    def start(self, loop):
        self.loop = loop

    def stop(self, drain_timeout):
        pass

    def submit(self, prompt, messages, params, request_id, queue, tag):
        text = f"{prompt or messages[-1]['content']} seed={params.seed}"
        for index in range(params.n):
            delta = StreamDelta(request_id, index, text, [], None, FinishReason.STOP)
            self.loop.call_soon_threadsafe(queue.put_nowait, (tag, delta))

    def abort(self, request_id):
        pass

    def engine_metrics(self):
        return {}


@hookimpl
def register_serving_backends(register):
    register("echo", lambda config, capabilities=None: Echo(capabilities))
'''


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """A server config on a backend from an installed plugin module, with its ``capabilities`` option."""
    (tmp_path / "echo_backend.py").write_text(THIRD_PARTY_BACKEND)
    monkeypatch.syspath_prepend(str(tmp_path))

    def config(capabilities: list[str] | None) -> EngineConfig:
        options = {} if capabilities is None else {"capabilities": capabilities}
        return EngineConfig.from_mapping(
            {
                "plugins": {"load": ["echo_backend"]},
                "server": {"backend": "echo", "backend_options": options, "model_name": "echo"},
            }
        )

    return config


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": 1}, "logprobs"),
        ({"echo": True, "logprobs": 0}, "logprobs"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"logit_bias": {"3": 1}}, "logit_bias"),
        ({"guided_choice": ["a", "b"]}, "guided_choice"),
        ({"stop": "x"}, "stop"),
        ({"seed": 7}, "seed"),
        ({"priority": 1}, "priority"),
    ],
)
def test_a_backend_that_declares_nothing_gets_only_the_baseline(third_party, body: dict, param: str) -> None:
    with RunningServer(third_party(None)) as server:
        assert (
            httpx.post(
                f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 4, "temperature": 0, "top_p": 0.5}
            ).json()["choices"][0]["text"]
            == "hi seed=None"
        )
        refused = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", **body})
        assert refused.status_code == 400
        assert refused.json()["error"] == {
            "message": f"{param} is not supported by this server's backend 'echo'",
            "type": "invalid_request_error",
            "param": param,
            "code": "unsupported_parameter",
        }


def test_a_declared_capability_is_passed_and_the_rest_still_refused(third_party) -> None:
    with RunningServer(third_party(["seed", "n"])) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        response = client.completions.create(model="echo", prompt="hi", seed=7, n=2)
        assert [c.text for c in response.choices] == ["hi seed=7", "hi seed=7"]
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="echo", messages=[{"role": "user", "content": "hi"}], seed=7, logit_bias={"3": 1}
            )
        assert refused.value.body["param"] == "logit_bias"


def test_a_misspelt_capability_stops_the_server_from_starting(third_party) -> None:
    with pytest.raises(
        ConfigError, match="serving backend 'echo' declares unknown capabilities 'logprob'; known: .*logprobs"
    ):
        create_app(third_party(["seed", "logprob"]))


def test_the_engine_backends_honour_every_parameter() -> None:
    assert AsyncEngine.capabilities == CAPABILITIES
    assert CommandBridge.capabilities | BASELINE == {"max_tokens", "temperature", "top_p", "n"}
