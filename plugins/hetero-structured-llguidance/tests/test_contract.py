"""The llguidance backend passes the structured-output contract on the embedded model's tokenizer
and the byte tokenizer."""

from __future__ import annotations

import pytest

from hetero_core.builtin.simple_tokenizer import SimpleTokenizer
from hetero_core.errors import ConfigError
from hetero_core.model_source import resolve_model_path
from hetero_core.testing import StructuredOutputBackendContract
from hetero_structured_llguidance import LLGuidanceBackend
from hetero_tokenizer_hf import load_tokenizer


class TestOnTheEmbeddedTokenizer(StructuredOutputBackendContract):
    @pytest.fixture(scope="class")
    @classmethod
    def tokenizer(cls):
        return load_tokenizer(resolve_model_path(None))

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, tokenizer):
        return LLGuidanceBackend(tokenizer)


class TestOnTheByteTokenizer(StructuredOutputBackendContract):
    @pytest.fixture(scope="class")
    @classmethod
    def tokenizer(cls):
        return SimpleTokenizer()

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, tokenizer):
        return LLGuidanceBackend(tokenizer)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"whitespace_flexible": "yes"}, "whitespace_flexible"),
        ({"max_cached_grammars": 0}, "max_cached_grammars"),
        ({"mask_threads": 0}, "mask_threads"),
        ({"cache": 3}, "no option .cache.; accepted: whitespace_flexible, max_cached_grammars"),
    ],
)
def test_bad_options_are_config_errors_naming_them(options, message) -> None:
    from hetero_core.plugins import ComponentRegistry, create_plugin_manager
    from hetero_structured_llguidance import plugin

    pm = create_plugin_manager(entry_points=False)
    pm.register(plugin, name="structured-llguidance")
    with pytest.raises(ConfigError, match=message):
        ComponentRegistry(pm).create("structured_output", "llguidance", options, SimpleTokenizer())


class _ShortVocabulary(SimpleTokenizer):
    def token_bytes(self) -> list[bytes]:
        return super().token_bytes()[:-1]


def test_token_bytes_must_list_the_whole_vocabulary() -> None:
    with pytest.raises(ConfigError, match="token_bytes.. lists 258 tokens, its vocab_size is 259"):
        LLGuidanceBackend(_ShortVocabulary())
