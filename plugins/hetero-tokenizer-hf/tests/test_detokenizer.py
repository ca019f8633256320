"""Streaming detokenization: pieces concatenate to the full decode and never split a character."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_tokenizer_hf.gguf_vocab import gpt2_byte_alphabet

texts = st.text(
    st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from("😀🌍👨‍👩‍👧中文é\n ")),
    min_size=1,
    max_size=60,
)
fixture_settings = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def byte_token(tokenizer, byte: int) -> int:
    return tokenizer.backend.token_to_id(gpt2_byte_alphabet()[byte])


def assert_no_broken_character(pieces: list[str], full_text: str) -> None:
    """No piece holds U+FFFD unless the full decode does (bytes missing from the vocabulary decode as U+FFFD)."""
    if "\ufffd" not in full_text:
        assert all("\ufffd" not in piece for piece in pieces)


def stream(
    tokenizer, ids: list[int], chunk_sizes: list[int], prompt: list[int], skip_special_tokens: bool = True
) -> list[str]:
    detokenizer = tokenizer.new_detokenizer(prompt, skip_special_tokens=skip_special_tokens)
    pieces, start, turn = [], 0, 0
    while start < len(ids):
        size = chunk_sizes[turn % len(chunk_sizes)]
        pieces.append(detokenizer.add(ids[start : start + size]))
        start, turn = start + size, turn + 1
    return [*pieces, detokenizer.finish()]


@fixture_settings
@given(texts)
def test_one_token_at_a_time(embedded, text: str) -> None:
    ids = embedded.encode(text)
    pieces = stream(embedded, ids, [1], embedded.encode("<|im_start|>assistant\n"))
    assert "".join(pieces) == embedded.decode(ids)
    assert_no_broken_character(pieces, embedded.decode(ids))


@fixture_settings
@given(texts, st.randoms(use_true_random=False), st.booleans())
def test_random_chunks(embedded, text: str, rng: random.Random, skip_special_tokens: bool) -> None:
    ids = embedded.encode(f"<|im_start|>{text}<|im_end|>")
    pieces = stream(
        embedded, ids, [rng.randint(1, 5) for _ in range(8)], embedded.encode("Prompt"), skip_special_tokens
    )
    assert "".join(pieces) == embedded.decode(ids, skip_special_tokens=skip_special_tokens)
    assert_no_broken_character(pieces, embedded.decode(ids))


def test_a_character_split_over_tokens_is_held_until_complete(embedded) -> None:
    first, second, third = (byte_token(embedded, byte) for byte in "中".encode())
    detokenizer = embedded.new_detokenizer([])
    assert [detokenizer.add([first]), detokenizer.add([second]), detokenizer.add([third])] == ["", "", "中"]


def test_an_unfinished_character_ends_as_a_replacement(embedded) -> None:
    first, second, _ = (byte_token(embedded, byte) for byte in "中".encode())
    ids = [*embedded.encode("ok"), first, second]
    detokenizer = embedded.new_detokenizer([])
    assert detokenizer.add(ids) + detokenizer.finish() == embedded.decode(ids) == "ok\ufffd"


def test_the_prompt_text_is_never_returned(embedded) -> None:
    first, second, third = (byte_token(embedded, byte) for byte in "中".encode())
    detokenizer = embedded.new_detokenizer([*embedded.encode("hello"), first])  # the prompt ends inside a character
    ids = [second, third, *embedded.encode(" ok")]
    assert detokenizer.add(ids) + detokenizer.finish() == embedded.decode(ids) == "\ufffd\ufffd ok"


def test_special_tokens_are_skipped_or_kept(embedded) -> None:
    ids = embedded.encode("a<|im_end|><|im_end|>b")
    assert "".join(stream(embedded, ids, [1], [])) == "ab"
    assert "".join(stream(embedded, ids, [1], [], skip_special_tokens=False)) == "a<|im_end|><|im_end|>b"
