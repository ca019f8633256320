"""Registers the ``huggingface`` tokenizer."""

from __future__ import annotations

from typing import Any

import attrs

from hetero_core.errors import ConfigError
from hetero_core.hookspecs import Register, hookimpl
from hetero_core.model_source import resolve_model_path
from hetero_tokenizer_hf.tokenizer import HuggingFaceTokenizer, load_tokenizer


def _path(_instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{attribute.name} must be a path (a non-empty string), got {value!r}", param=attribute.name)


@attrs.frozen
class HuggingFaceTokenizerOptions:
    """The ``huggingface`` tokenizer's options: ``path`` overrides the model's own tokenizer."""

    path: str | None = attrs.field(default=None, validator=_path)


def create(config: Any, path: str | None = None) -> HuggingFaceTokenizer:
    """The model's tokenizer, or the one at ``path`` (a tokenizer.json, a folder or a GGUF file)."""
    if path is not None:
        return load_tokenizer(path, param="tokenizer.path")
    return load_tokenizer(resolve_model_path(config.model), param="model")


@hookimpl
def register_tokenizers(register: Register) -> None:
    register("huggingface", create, options=HuggingFaceTokenizerOptions)
