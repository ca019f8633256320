"""Registers the ``serve`` and ``batch`` commands and the ``local_engine`` and ``command_bridge`` serving backends.

The web stack loads only when a server or a backend is built.
"""

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
    from hetero_serve_openai.config import server_config

    return CommandBridge(server_config(config))


@hookimpl
def register_serving_backends(register: Register) -> None:
    register("local_engine", local_engine)
    register("command_bridge", command_bridge)


def serve(argv: list[str]) -> int:
    """``hetero-infer serve``: the OpenAI-compatible server (``--help`` for its flags)."""
    from hetero_serve_openai.cli import serve_command

    return serve_command(argv)


def batch(argv: list[str]) -> int:
    """``hetero-infer batch --input-file FILE``: a prompts file through the serving backend
    (replicas with ``--data-parallel-size``)."""
    from hetero_serve_openai.batch import batch_command

    return batch_command(argv)


@hookimpl
def register_commands(register: Register) -> None:
    register("serve", serve)
    register("batch", batch)
