"""The built-in plugin: registers the reference components through the ordinary hooks."""

from __future__ import annotations

from hetero_core.builtin.mock_executor import MockExecutor, MockExecutorOptions
from hetero_core.builtin.simple_tokenizer import SimpleTokenizer, SimpleTokenizerOptions
from hetero_core.hookspecs import Register, hookimpl


@hookimpl
def register_tokenizers(register: Register) -> None:
    register("simple", SimpleTokenizer, options=SimpleTokenizerOptions)


@hookimpl
def register_executors(register: Register) -> None:
    register("mock", MockExecutor, options=MockExecutorOptions)
