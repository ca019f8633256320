"""Which serving backend the config asks for, and building it.

A backend (:class:`~hetero_core.serving.ServingBackend`) is registered by name
through the ``register_serving_backends`` hook and chosen by
``server.backend``; with ``data_parallel_size`` above 1 the default
``local_engine`` gives way to ``data_parallel_backend`` (``ray`` when the
``hetero-serve-ray`` plugin is installed).
"""

from __future__ import annotations

import pluggy

from hetero_core.components import ComponentRegistry
from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.plugins import create_plugin_manager
from hetero_core.serving import ServingBackend
from hetero_serve_openai.config import server_config

DEFAULT_BACKEND = "local_engine"


def backend_name(config: EngineConfig) -> str:
    """The backend ``config`` asks for: ``server.backend``,
    or ``data_parallel_backend`` for replicas of the local engine."""
    backend = server_config(config).backend
    if config.data_parallel_size == 1:
        return backend
    if backend not in (DEFAULT_BACKEND, config.data_parallel_backend):
        raise ConfigError(
            f"data_parallel_size={config.data_parallel_size} replicates the engine; backend {backend!r}"
            f" has no engine to replicate (use backend {DEFAULT_BACKEND!r} or {config.data_parallel_backend!r})",
            param="data_parallel_size",
        )
    return config.data_parallel_backend


def create_backend(config: EngineConfig, *, plugin_manager: pluggy.PluginManager | None = None) -> ServingBackend:
    """Build the backend ``config`` names, through the ``register_serving_backends`` hook."""
    pm = plugin_manager or create_plugin_manager(disable=config.plugins.disable, load=config.plugins.load)
    registry = ComponentRegistry(pm)
    return registry.create("serving_backend", backend_name(config), dict(server_config(config).backend_options), config)
