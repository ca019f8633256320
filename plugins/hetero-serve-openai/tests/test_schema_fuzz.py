"""Property-based fuzzing of the server's own OpenAPI schema: no input may cause a 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import RunningServer, mock_server_config

OPERATIONS = [
    "POST /v1/completions",
    "POST /v1/chat/completions",
    "POST /v1/responses",
    "POST /tokenize",
    "POST /detokenize",
    "GET /v1/models",
]


@pytest.fixture(scope="module")
def server():
    config = mock_server_config(max_model_len=256, server={"model_name": "mock"})
    with RunningServer(config) as running:
        yield running


@pytest.mark.parametrize("operation", OPERATIONS)
def test_no_input_causes_a_server_error(server, operation: str) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    method, path = operation.split(" ")
    api_operation = schema[path][method]
    strategy = api_operation.as_strategy()

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.data())
    def fuzz(data) -> None:
        case = data.draw(strategy)
        response = case.call(base_url=server.url, timeout=30)
        assert response.status_code < 500, f"{operation} {case.body!r} -> {response.status_code}: {response.text[:300]}"

    fuzz()
