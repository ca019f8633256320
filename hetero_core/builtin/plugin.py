"""The built-in plugin: registers the reference components through the ordinary hooks."""

from __future__ import annotations

from typing import Any

from hetero_core.builtin.mock_executor import MockExecutor, MockExecutorOptions
from hetero_core.builtin.simple_tokenizer import SimpleTokenizer, SimpleTokenizerOptions
from hetero_core.hookspecs import Register, hookimpl


@hookimpl
def register_tokenizers(register: Register) -> None:
    register("simple", SimpleTokenizer, options=SimpleTokenizerOptions)


@hookimpl
def register_executors(register: Register) -> None:
    register("mock", MockExecutor, options=MockExecutorOptions)


# the serving backends import the web stack: only when a server is built
def local_engine(config: Any) -> Any:
    """One :class:`~hetero_core.engine.InferenceEngine` in this process, stepped on a background thread."""
    from hetero_core.server.async_engine import AsyncEngine

    return AsyncEngine(config)


def command_bridge(config: Any) -> Any:
    """Each request answered by running ``config.server.command``."""
    from hetero_core.server.command_bridge import CommandBridge

    return CommandBridge(config.server)


@hookimpl
def register_serving_backends(register: Register) -> None:
    register("local_engine", local_engine)
    register("command_bridge", command_bridge)
