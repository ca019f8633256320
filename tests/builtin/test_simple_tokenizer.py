"""The built-in byte-level tokenizer round-trips any text, whole or streamed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero_core.builtin import SimpleTokenizer
from hetero_core.errors import ValidationError
from hetero_core.testing import TokenizerContract

valid_text = st.text(st.characters(exclude_categories=("Cs",)))
text_without_replacement_character = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\ufffd"))


class TestSimpleTokenizerContract(TokenizerContract):
    @pytest.fixture
    def tokenizer(self):
        return SimpleTokenizer()


@given(valid_text)
def test_round_trip(text: str) -> None:
    tokenizer = SimpleTokenizer()
    assert tokenizer.decode(tokenizer.encode(text)) == text


@given(
    text_without_replacement_character, st.lists(st.integers(1, 5), min_size=1)
)  # so a U+FFFD can only come from a split
def test_streaming_in_chunks_concatenates_to_the_text(text: str, chunk_sizes: list[int]) -> None:
    tokenizer = SimpleTokenizer()
    ids = tokenizer.encode(text)
    detokenizer = tokenizer.new_detokenizer([])
    pieces, start = [], 0
    for size in chunk_sizes * (len(ids) + 1):
        if start >= len(ids):
            break
        pieces.append(detokenizer.add(ids[start : start + size]))
        start += size
    pieces.append(detokenizer.finish())
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_bos_only_when_asked() -> None:
    assert SimpleTokenizer(add_bos=True).encode("a") == [SimpleTokenizer.BOS, 97]
    assert SimpleTokenizer(add_bos=True).encode("a", add_special_tokens=False) == [97]
    assert SimpleTokenizer().encode("a") == [97]


def test_lone_surrogates_are_rejected() -> None:
    with pytest.raises(ValidationError, match="not valid Unicode"):
        SimpleTokenizer().encode("\ud800")
