"""Reference components that ship with the core: the ``simple`` tokenizer and the ``mock`` executor."""

from hetero_core.builtin.mock_executor import MockExecutor
from hetero_core.builtin.simple_tokenizer import SimpleTokenizer

__all__ = ["MockExecutor", "SimpleTokenizer"]
