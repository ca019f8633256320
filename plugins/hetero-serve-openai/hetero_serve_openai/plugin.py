"""Registers the ``local_engine`` and ``command_bridge`` serving backends (the web stack loads only when one is built)."""

from __future__ import annotations

from typing import Any

from hetero_core.hookspecs import Register, hookimpl


def local_engine(config: Any) -> Any:
    """One :class:`~hetero_core.engine.InferenceEngine` in this process, stepped on a background thread."""
    from hetero_serve_openai.async_engine import AsyncEngine

    return AsyncEngine(config)


def command_bridge(config: Any) -> Any:
    """Each request answered by running ``config.server.command``."""
    from hetero_serve_openai.command_bridge import CommandBridge

    return CommandBridge(config.server)


@hookimpl
def register_serving_backends(register: Register) -> None:
    register("local_engine", local_engine)
    register("command_bridge", command_bridge)
