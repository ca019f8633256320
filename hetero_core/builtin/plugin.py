"""The built-in plugin: registers the reference components through the ordinary hooks."""

from __future__ import annotations

from typing import Any

from hetero_core.builtin.mock_executor import MockExecutor
from hetero_core.builtin.simple_tokenizer import SimpleTokenizer
from hetero_core.hookspecs import Register, hookimpl


@hookimpl
def register_tokenizers(register: Register) -> None:
    register("simple", lambda config, **options: SimpleTokenizer(**options))


@hookimpl
def register_executors(register: Register) -> None:
    def mock(config: Any, **options: Any) -> MockExecutor:
        return MockExecutor(**options)

    register("mock", mock)
