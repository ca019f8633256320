"""Contract tests for tokenizers.

Subclass :class:`TokenizerContract` and override the ``tokenizer`` fixture::

    class TestMyTokenizer(TokenizerContract):
        @pytest.fixture(scope="class")
        def tokenizer(self):
            return MyTokenizer()
"""

from __future__ import annotations

import pytest

from hetero_core.errors import ValidationError
from hetero_core.protocols import Tokenizer

SAMPLE_TEXTS = [
    "Hello, world!",
    "  leading and trailing spaces  ",
    "line one\nline two\n\ttabbed",
    "numbers 1234567890 and symbols #@$%^&*()",
    "naïve café, Straße, ça va?",
    "日本語のテキストと中文",
    "emoji 🌍🚀 and a family 👨‍👩‍👧",
    "def f(x):\n    return x ** 2  # code",
]


class TokenizerContract:
    """What every tokenizer must do (see :class:`hetero_core.protocols.Tokenizer`)."""

    @pytest.fixture
    def tokenizer(self) -> Tokenizer:
        raise NotImplementedError("override the 'tokenizer' fixture")

    @pytest.mark.parametrize("text", SAMPLE_TEXTS)
    def test_round_trip(self, tokenizer: Tokenizer, text: str) -> None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert all(isinstance(i, int) and 0 <= i < tokenizer.vocab_size for i in ids)
        assert tokenizer.decode(ids) == text

    @pytest.mark.parametrize("text", SAMPLE_TEXTS)
    def test_streaming_matches_the_full_decode(self, tokenizer: Tokenizer, text: str) -> None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        detokenizer = tokenizer.new_detokenizer(tokenizer.encode("Prompt:", add_special_tokens=True))
        pieces = [detokenizer.add([i]) for i in ids]
        pieces.append(detokenizer.finish())
        assert "".join(pieces) == tokenizer.decode(ids)
        assert all("\ufffd" not in piece for piece in pieces)

    def test_special_ids_are_in_the_vocabulary(self, tokenizer: Tokenizer) -> None:
        for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id):
            assert token_id is None or 0 <= token_id < tokenizer.vocab_size

    def test_chat_template_renders_text(self, tokenizer: Tokenizer) -> None:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}])
        assert isinstance(rendered, str) and "What is 2 + 2?" in rendered

    @pytest.mark.parametrize("messages", [[], [{"role": "user"}], [{"content": "hi"}], ["hi"], [{"role": "user", "content": 3}]])
    def test_chat_template_rejects_malformed_messages(self, tokenizer: Tokenizer, messages: list) -> None:
        with pytest.raises(ValidationError):
            tokenizer.apply_chat_template(messages)
