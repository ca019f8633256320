"""The ``server`` section of the config file: this plugin's settings, checked key by key when it serves.

The core keeps the section as given (:attr:`~hetero_core.config.EngineConfig.server`);
:func:`server_config` reads it into :class:`ServerConfig`, so an unknown key
(``server.prot``) or a bad value is a ``ConfigError`` that names it.
"""

from __future__ import annotations

import shlex
from typing import Any, Mapping

import attrs

from hetero_core.config import EngineConfig, config_section
from hetero_core.errors import ConfigError
from hetero_core.validators import boolean, named_options, non_empty_string, number_in, optional

_positive_int = number_in(1, None, integer=True, error=ConfigError)


_name = non_empty_string(error=ConfigError)
_optional_name = optional(_name)


@attrs.frozen
class ServerConfig:
    """The OpenAI-compatible HTTP server (``hetero-infer serve``)."""

    host: str = attrs.field(default="127.0.0.1", validator=_name)
    port: int = attrs.field(default=8000, validator=number_in(0, 65535, integer=True, error=ConfigError))
    model_name: str | None = attrs.field(
        default=None, validator=_optional_name
    )  # the name clients use; defaults to the model file's name
    backend: str = attrs.field(default="local_engine", validator=_name)  # a registered serving backend's name
    backend_options: Mapping[str, Any] = attrs.field(
        factory=dict, converter=named_options("server.backend_options")
    )  # keyword options for its factory
    command: tuple[str, ...] = attrs.field(
        default=(), converter=lambda v: tuple(shlex.split(v) if isinstance(v, str) else v)
    )  # command_bridge: program and arguments
    command_timeout: float = attrs.field(default=60.0, validator=number_in(0, None, low_open=True, error=ConfigError))
    command_concurrency: int = attrs.field(default=4, validator=_positive_int)
    command_max_output_bytes: int = attrs.field(
        default=4 * 1024 * 1024, validator=_positive_int
    )  # command_bridge: a program's stdout; a 502 beyond
    api_key: str | None = attrs.field(
        default=None, validator=_optional_name
    )  # also HETERO_API_KEY; None leaves the server open
    max_body_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=_positive_int)
    drain_timeout: float = attrs.field(default=30.0, validator=number_in(0, None, error=ConfigError))
    max_connections: int = attrs.field(
        default=1024, validator=_positive_int
    )  # open connections; the oldest idle one makes way
    read_timeout: float = attrs.field(
        default=30.0, validator=number_in(0, None, low_open=True, error=ConfigError)
    )  # to receive a request
    max_choices_per_request: int = attrs.field(default=256, validator=_positive_int)  # prompts x n in one request
    max_response_bytes: int = attrs.field(
        default=32 * 1024 * 1024, validator=_positive_int
    )  # estimated from the request; a 400 beyond
    protect_metrics_and_docs: bool = attrs.field(
        default=False, validator=boolean(error=ConfigError)
    )  # behind the API key too

    def __attrs_post_init__(self) -> None:
        if self.backend == "command_bridge" and not self.command:
            raise ConfigError(
                "server.command must name the program to run for backend 'command_bridge'", param="server.command"
            )


def server_config(config: EngineConfig) -> ServerConfig:
    """``config``'s ``server`` section, checked; a ``ConfigError`` names the key that is wrong."""
    return config_section(ServerConfig, config.server, "server")
