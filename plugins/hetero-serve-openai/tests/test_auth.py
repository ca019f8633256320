"""The API key is checked before the body is read; what the open endpoints answer, and what they keep to themselves."""

from __future__ import annotations

import httpx
import openai
import pytest

from hetero_core.errors import ConfigError
from hetero_serve_openai.app import create_app

from .conftest import RunningServer, mock_server_config

KEY = {"authorization": "Bearer sekret"}


@pytest.fixture(scope="module")
def keyed_server():
    with RunningServer(mock_server_config(server={"api_key": "sekret"})) as server:
        yield server


def test_api_key(keyed_server) -> None:
    url = keyed_server.url
    assert httpx.get(f"{url}/v1/models").status_code == 401
    assert httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{url}/v1/models", headers=KEY).status_code == 200
    for scheme in ("bearer", "BEARER", "bEaReR"):  # the scheme's case does not matter in HTTP; the key's does
        assert httpx.get(f"{url}/v1/models", headers={"authorization": f"{scheme} sekret"}).status_code == 200, scheme
    for wrong in ("Bearer SEKRET", "Basic sekret", "Bearersekret", "sekret"):
        assert httpx.get(f"{url}/v1/models", headers={"authorization": wrong}).status_code == 401, wrong
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    assert openai.OpenAI(base_url=f"{url}/v1", api_key="sekret", max_retries=0).models.list().data


def test_the_key_is_checked_before_the_body_is_parsed(keyed_server) -> None:
    headers = {"content-type": "application/json"}
    malformed = httpx.post(f"{keyed_server.url}/v1/completions", content=b"{not json", headers=headers)
    assert malformed.status_code == 401 and malformed.json()["error"]["code"] == "invalid_api_key"
    assert malformed.headers["www-authenticate"] == "Bearer"
    huge = httpx.post(f"{keyed_server.url}/v1/completions", content=b"x" * (5 * 1024 * 1024), headers=headers)
    assert huge.status_code == 401
    assert (
        httpx.post(f"{keyed_server.url}/v1/completions", content=b"{not json", headers={**headers, **KEY}).status_code
        == 400
    )


def test_health_metrics_and_docs_are_open_by_default(keyed_server) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
        assert httpx.get(f"{keyed_server.url}{path}").status_code == 200, path


def test_metrics_and_docs_can_need_the_key() -> None:
    config = mock_server_config(server={"api_key": "sekret", "protect_metrics_and_docs": True})
    with RunningServer(config) as server:
        for path in ("/metrics", "/openapi.json", "/docs", "/redoc"):
            assert httpx.get(f"{server.url}{path}").status_code == 401, path
            assert httpx.get(f"{server.url}{path}", headers=KEY).status_code == 200, path
        assert httpx.get(f"{server.url}/healthz").status_code == 200


@pytest.mark.parametrize("key", ["clé", "two words", "tab\there"])
def test_a_key_no_header_can_carry_is_refused_at_start_up(key: str, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="server.api_key must be a string of printable ASCII"):
        create_app(mock_server_config(server={"api_key": key}))
    monkeypatch.setenv("HETERO_API_KEY", key)
    with pytest.raises(ConfigError, match="HETERO_API_KEY must be a string of printable ASCII"):
        create_app(mock_server_config())


def test_head_probes(mock_server) -> None:
    for path in ("/healthz", "/readyz"):
        response = httpx.head(f"{mock_server.url}{path}")
        assert response.status_code == 200 and response.content == b""
