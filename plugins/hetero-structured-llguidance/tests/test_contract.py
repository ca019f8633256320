"""The llguidance backend passes the structured-output contract on the embedded model's tokenizer and the byte tokenizer."""

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
    def tokenizer(self):
        return load_tokenizer(resolve_model_path(None))

    @pytest.fixture(scope="class")
    def backend(self, tokenizer):
        return LLGuidanceBackend(tokenizer)


class TestOnTheByteTokenizer(StructuredOutputBackendContract):
    @pytest.fixture(scope="class")
    def tokenizer(self):
        return SimpleTokenizer()

    @pytest.fixture(scope="class")
    def backend(self, tokenizer):
        return LLGuidanceBackend(tokenizer)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"whitespace_flexible": "yes"}, "whitespace_flexible must be a boolean"),
        ({"max_cached_grammars": 0}, "max_cached_grammars must be an integer >= 1"),
    ],
)
def test_bad_options_are_config_errors(options, message) -> None:
    with pytest.raises(ConfigError, match=message):
        LLGuidanceBackend(SimpleTokenizer(), **options)


def test_a_tokenizer_without_a_readable_vocabulary_is_refused() -> None:
    class Opaque:
        vocab_size, bos_token_id, eos_token_id, pad_token_id = 10, None, 9, None

    with pytest.raises(ConfigError, match="cannot read the vocabulary of Opaque"):
        LLGuidanceBackend(Opaque())
