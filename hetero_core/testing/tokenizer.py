"""Contract tests for tokenizers.

Subclass :class:`TokenizerContract` and override the ``tokenizer`` fixture
(any scope; loading once per class keeps the run fast). A fixture wider
than one test is a ``classmethod`` under ``@pytest.fixture``, as pytest
requires of class-scoped fixtures::

    class TestMyTokenizer(TokenizerContract):
        @pytest.fixture(scope="class")
        @classmethod
        def tokenizer(cls):
            return MyTokenizer()

The checks follow :class:`hetero_core.protocols.Tokenizer`: plain text
round-trips, ids stay in the vocabulary, streamed pieces concatenate to the
full decode without splitting a character, every token's bytes join into
the text it encodes, the control tokens include BOS, EOS and PAD and decode
to nothing, and the chat template renders
well-formed messages (tools and tool-call history included, with the
rendering options) and rejects malformed ones with ``ValidationError``.
"""

from __future__ import annotations

from typing import Any

import pytest

from hetero_core.errors import ValidationError
from hetero_core.protocols import IncrementalDetokenizer, Tokenizer

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

MALFORMED_MESSAGES: list[Any] = [
    [],
    [{"role": "user"}],
    [{"content": "hi"}],
    ["hi"],
    [{"role": "user", "content": 3}],
    [{"role": "user", "content": None}],
    [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}],
    [{"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]}],
    "user: hi",
]


LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_word",
        "description": "Finds a word in the dictionary",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}
TOOL_CONVERSATION = [
    {"role": "user", "content": "What does serendipity mean?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup_word", "arguments": {"word": "serendipity"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "a happy accident"},
]


def stream(detokenizer: IncrementalDetokenizer, token_ids: list[int], chunk_size: int) -> list[str]:
    """Feed ``token_ids`` ``chunk_size`` at a time; the pieces returned, ending with ``finish()``."""
    pieces = [detokenizer.add(token_ids[start : start + chunk_size]) for start in range(0, len(token_ids), chunk_size)]
    return [*pieces, detokenizer.finish()]


class TokenizerContract:
    """What every tokenizer must do (see :class:`hetero_core.protocols.Tokenizer`)."""

    @pytest.fixture(scope="class")
    @classmethod
    def tokenizer(cls) -> Tokenizer:
        raise NotImplementedError("override the 'tokenizer' fixture")

    def test_implements_the_protocol(self, tokenizer: Tokenizer) -> None:
        assert isinstance(tokenizer, Tokenizer)
        assert isinstance(tokenizer.new_detokenizer([]), IncrementalDetokenizer)
        assert isinstance(tokenizer.vocab_size, int) and tokenizer.vocab_size > 0

    @pytest.mark.parametrize("text", SAMPLE_TEXTS)
    def test_round_trip(self, tokenizer: Tokenizer, text: str) -> None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert all(isinstance(i, int) and 0 <= i < tokenizer.vocab_size for i in ids)
        assert tokenizer.decode(ids) == text

    @pytest.mark.parametrize("text", SAMPLE_TEXTS[:3])
    def test_special_tokens_only_add_a_bos_prefix(self, tokenizer: Tokenizer, text: str) -> None:
        plain = tokenizer.encode(text, add_special_tokens=False)
        with_special = tokenizer.encode(text, add_special_tokens=True)
        prefix = with_special[: len(with_special) - len(plain)]
        assert with_special[len(prefix) :] == plain
        assert prefix in ([], [tokenizer.bos_token_id])
        assert tokenizer.decode(with_special, skip_special_tokens=True) == text

    def test_empty_text(self, tokenizer: Tokenizer) -> None:
        assert tokenizer.encode("", add_special_tokens=False) == []
        assert tokenizer.decode([]) == ""

    @pytest.mark.parametrize("chunk_size", [1, 3, 1000])
    @pytest.mark.parametrize("text", SAMPLE_TEXTS)
    def test_streaming_matches_the_full_decode(self, tokenizer: Tokenizer, text: str, chunk_size: int) -> None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        detokenizer = tokenizer.new_detokenizer(tokenizer.encode("Prompt:", add_special_tokens=True))
        pieces = stream(detokenizer, ids, chunk_size)
        assert "".join(pieces) == tokenizer.decode(ids)
        assert all("\ufffd" not in piece for piece in pieces)

    def test_streaming_never_returns_the_prompt(self, tokenizer: Tokenizer) -> None:
        detokenizer = tokenizer.new_detokenizer(tokenizer.encode("The prompt text", add_special_tokens=True))
        assert detokenizer.add([]) == ""
        assert detokenizer.finish() == ""

    def test_special_ids_are_in_the_vocabulary(self, tokenizer: Tokenizer) -> None:
        for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id):
            assert token_id is None or (isinstance(token_id, int) and 0 <= token_id < tokenizer.vocab_size)

    def test_special_token_ids_are_the_control_tokens(self, tokenizer: Tokenizer) -> None:
        special = tokenizer.special_token_ids
        assert isinstance(special, frozenset) and all(0 <= token_id < tokenizer.vocab_size for token_id in special)
        for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id):
            assert token_id is None or token_id in special
        assert tokenizer.decode(sorted(special), skip_special_tokens=True) == ""

    def test_token_bytes_list_the_whole_vocabulary(self, tokenizer: Tokenizer) -> None:
        token_bytes = tokenizer.token_bytes()
        assert len(token_bytes) == tokenizer.vocab_size
        assert all(isinstance(piece, bytes) for piece in token_bytes)
        assert tokenizer.token_bytes() == token_bytes

    @pytest.mark.parametrize("text", SAMPLE_TEXTS)
    def test_token_bytes_join_into_the_text(self, tokenizer: Tokenizer, text: str) -> None:
        token_bytes = tokenizer.token_bytes()
        joined = b"".join(token_bytes[token_id] for token_id in tokenizer.encode(text, add_special_tokens=False))
        assert joined in (text.encode("utf-8"), b" " + text.encode("utf-8"))

    def test_eos_is_left_out_when_skipping_special_tokens(self, tokenizer: Tokenizer) -> None:
        if tokenizer.eos_token_id is None:
            pytest.skip("no EOS token")
        ids = [*tokenizer.encode("done", add_special_tokens=False), tokenizer.eos_token_id]
        assert tokenizer.decode(ids, skip_special_tokens=True) == "done"
        assert "".join(stream(tokenizer.new_detokenizer([]), ids, 1)) == "done"

    def test_chat_template_renders_text(self, tokenizer: Tokenizer) -> None:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
        rendered = tokenizer.apply_chat_template(messages)
        assert isinstance(rendered, str) and "What is 2 + 2?" in rendered
        assert isinstance(tokenizer.apply_chat_template(messages, add_generation_prompt=False), str)

    def test_chat_template_shows_tools_and_tool_history(self, tokenizer: Tokenizer) -> None:
        rendered = tokenizer.apply_chat_template(TOOL_CONVERSATION, tools=[LOOKUP_TOOL])
        for shown in ("lookup_word", "Finds a word in the dictionary", "serendipity", "a happy accident"):
            assert shown in rendered
        without_tools = tokenizer.apply_chat_template(TOOL_CONVERSATION)
        assert "Finds a word in the dictionary" not in without_tools and "a happy accident" in without_tools

    def test_chat_template_rendering_options(self, tokenizer: Tokenizer) -> None:
        chat = [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two"}]
        continued = tokenizer.apply_chat_template(chat, add_generation_prompt=False, continue_final_message=True)
        closed = tokenizer.apply_chat_template(chat, add_generation_prompt=False)
        assert continued.endswith("One, two") and closed.startswith(continued) and closed != continued
        assert tokenizer.apply_chat_template(
            chat, template_kwargs={"unused_variable": True}
        ) == tokenizer.apply_chat_template(chat)

    @pytest.mark.parametrize("messages", MALFORMED_MESSAGES)
    def test_chat_template_rejects_malformed_messages(self, tokenizer: Tokenizer, messages: Any) -> None:
        with pytest.raises(ValidationError):
            tokenizer.apply_chat_template(messages)
