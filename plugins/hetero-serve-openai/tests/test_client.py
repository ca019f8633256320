"""BackendClient drives any serving backend from synchronous code: batches in order, streams, early exits."""

from __future__ import annotations

import time

import pytest
import structlog

from hetero_core.cli.main import build_parser
from hetero_core.cli.options import engine_config
from hetero_core.engine import InferenceEngine
from hetero_core.errors import ConfigError, EngineError, ValidationError
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason
from hetero_serve_openai.async_engine import AsyncEngine
from hetero_serve_openai.client import BackendClient

from .conftest import mock_server_config


def test_generate_keeps_input_order_and_matches_the_engine() -> None:
    config = mock_server_config()
    prompts = [f"prompt number {i}" for i in range(6)]
    params = GenerationParams(max_tokens=5, temperature=0, n=2)
    with BackendClient(AsyncEngine(config)) as client:
        finished = []
        choices = client.generate([*prompts, [{"role": "user", "content": "hi"}]], params, on_finished=finished.append)
    assert len(choices) == len(finished) == 14
    expected = InferenceEngine(config).generate(prompts, params)
    assert [c.text for c in choices[:12:2]] == [r.output_text for r in expected]
    assert all(c.finish_reason is FinishReason.LENGTH for c in choices)


def test_stream_yields_deltas_and_an_early_exit_aborts() -> None:
    backend = AsyncEngine(mock_server_config(executor={"name": "mock", "vocab_size": 128, "step_latency": 0.002}))
    with BackendClient(backend) as client:
        deltas = list(client.stream("tell me", GenerationParams(max_tokens=8, temperature=0)))
        assert sum(len(d.token_ids) for d in deltas) == 8 and deltas[-1].finish_reason is FinishReason.LENGTH
        stream = client.stream("a long one", GenerationParams(max_tokens=500, temperature=0))
        next(stream)
        stream.close()
        engine = backend.engine
        deadline = time.monotonic() + 5
        while not engine.metrics.requests_finished[FinishReason.ABORT] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.metrics.requests_finished[FinishReason.ABORT] == 1


def test_bad_input_raises_in_the_caller() -> None:
    with BackendClient(AsyncEngine(mock_server_config())) as client:
        with pytest.raises(EngineError, match="prompt must not be empty"):
            client.generate([""], GenerationParams(max_tokens=2))


def test_parameters_the_backend_does_not_honour_are_refused_by_name() -> None:
    """As the server's 400: a backend that declares only ``n`` gets no logit_bias it would drop."""
    backend = AsyncEngine(mock_server_config())
    backend.capabilities = frozenset({"n"})
    with BackendClient(backend, name="narrow") as client:
        with pytest.raises(
            ValidationError, match="logit_bias is not supported by the serving backend 'narrow'"
        ) as refused:
            client.generate(["hi"], GenerationParams(max_tokens=2, logit_bias={3: 1.0}))
        assert refused.value.param == "logit_bias"
        with pytest.raises(ValidationError, match="stop"):
            next(client.stream("hi", GenerationParams(max_tokens=2, stop=["x"])))
        assert len(client.generate(["hi"], GenerationParams(max_tokens=2, n=2))) == 2  # what it honours still runs
        assert backend.engine.metrics.requests_submitted == 1  # the refused ones never reached it


def test_a_misspelt_capability_fails_before_the_backend_starts() -> None:
    backend = AsyncEngine(mock_server_config())
    backend.capabilities = frozenset({"logit_biass"})
    with pytest.raises(ConfigError, match="unknown capabilities 'logit_biass'"):
        BackendClient(backend)


def test_a_backend_that_cannot_load_raises() -> None:
    with pytest.raises(EngineError, match="did not become ready: the model failed to load"):
        BackendClient(AsyncEngine(mock_server_config(executor={"name": "mock", "bogus": 1})))


def test_the_data_parallel_flags_set_the_config_keys() -> None:
    arguments = [
        "--data-parallel-size",
        "3",
        "-o",
        "server.backend_options.address=10.0.0.1:6379",
        "-o",
        "server.backend_options.max_restarts=2",
    ]
    config = engine_config(build_parser().parse_args(arguments))
    assert config.data_parallel_size == 3
    assert config.server["backend_options"] == {"address": "10.0.0.1:6379", "max_restarts": 2}


def test_the_ray_address_flag_points_at_the_backend_option() -> None:
    with pytest.raises(ConfigError, match=r"use -o server.backend_options.address=10.0.0.1:6379"):
        engine_config(build_parser().parse_args(["--ray-address", "10.0.0.1:6379"]))


def test_replicas_apply_to_serve_and_input_files_only(capsys) -> None:
    from hetero_core.cli.main import main

    saved = structlog.get_config()  # the CLI configures logging for its process
    try:
        assert main(["--input", "hi", "--data-parallel-size", "2", "--tokenizer", "simple", "--executor", "mock"]) == 2
    finally:
        structlog.configure(**saved)
    assert "--data-parallel-size applies to serve and --input-file" in capsys.readouterr().err
