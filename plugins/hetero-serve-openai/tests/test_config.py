"""The ``server`` section: kept as given by the core, checked key by key by this plugin."""

from __future__ import annotations

import json

import pytest

from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_serve_openai.config import ServerConfig, server_config


def test_the_section_is_read_with_its_defaults() -> None:
    server = server_config(EngineConfig.from_mapping({"server": {"port": 9, "command": "bridge --fast"}}))
    assert (server.host, server.port, server.command, server.backend) == (
        "127.0.0.1",
        9,
        ("bridge", "--fast"),
        "local_engine",
    )
    assert server_config(EngineConfig()) == ServerConfig()


def test_the_seed_config_file_with_its_server_section_loads(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"block_size": 16, "server": {"host": "0.0.0.0", "port": 8080, "backend": "local_engine"}})
    )
    server = server_config(EngineConfig.from_file(path))
    assert (server.host, server.port) == ("0.0.0.0", 8080)


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"prot": 1}, r"unknown config key\(s\) server\.prot; allowed: api_key, backend"),
        ({"backend": ""}, "backend must be a non-empty string"),
        ({"port": 99999}, r"port must be an integer in \[0, 65535\], got 99999"),
        ({"backend_options": ["routing"]}, "server.backend_options must be an object of named options"),
        ({"backend": "command_bridge"}, "server.command must name the program"),
        ({"api_key": 12345}, "api_key must be a non-empty string, got 12345"),
        ({"api_key": ""}, "api_key must be a non-empty string"),
        ({"model_name": ["x"]}, "model_name must be a non-empty string"),
        ({"protect_metrics_and_docs": "yes"}, "protect_metrics_and_docs must be true or false, got 'yes'"),
    ],
)
def test_bad_keys_and_values_are_named(section, match: str) -> None:
    config = EngineConfig.from_mapping({"server": section})  # the core keeps the section as given
    with pytest.raises(ConfigError, match=match):
        server_config(config)
