"""Encoding matches transformers' tokenizer for the same GGUF file, token for token."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_core.errors import ValidationError
from hetero_core.testing.tokenizer import SAMPLE_TEXTS
from hetero_tokenizer_hf import load_tokenizer

FIXED_TEXTS = [
    *SAMPLE_TEXTS,
    "The quick brown fox jumps over the lazy dog.",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "import numpy as np\n\n\nclass A:\n    pass\n",
    "😀😃😄 🇫🇷 🏳️‍🌈 ❤️",
    "漢字かなカナ한국어 中文标点，。！",
    "tabs\t\tand   spaces    and\n\n\nnewlines\r\n",
    "a  1, x\n\n2, '  12', \t\t9",  # digits after runs of whitespace
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<repo_name>x<file_sep>",
    "<|im_start|>  <|im_end|>  4",
    "I'm sure they'll say it's OK, weren't they? DON'T",
    "1,000.50$ 3.14159 2024-01-01 0x1F",
    "",
    " ",
    "x" * 300,
]

FRAGMENTS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "  ", "\n", "\t", " 12", "'s", "😀", "中文", "é"]
texts = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(st.characters(exclude_categories=("Cs",)), max_size=12)),
    max_size=8,
).map("".join)


def test_special_ids_follow_the_file(embedded) -> None:
    assert (embedded.bos_token_id, embedded.eos_token_id, embedded.pad_token_id) == (1, 2, 2)
    assert embedded.vocab_size == 49152
    assert embedded.encode("hi") == embedded.encode("hi", add_special_tokens=False)  # add_bos_token is false


@pytest.mark.parametrize("text", FIXED_TEXTS)
def test_encoding_matches_transformers(embedded, reference, text: str) -> None:
    assert embedded.encode(text) == reference.encode(text, add_special_tokens=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts)
def test_encoding_matches_transformers_on_any_text(embedded, reference, text: str) -> None:
    assert embedded.encode(text) == reference.encode(text, add_special_tokens=True)


@pytest.mark.parametrize("text", FIXED_TEXTS[:12])
def test_decoding_matches_transformers(embedded, reference, text: str) -> None:
    ids = reference.encode(text, add_special_tokens=False)
    for skip in (True, False):
        assert embedded.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt2"])
def test_other_pre_tokenizers_match_transformers(write_gguf, load_reference, pre: str) -> None:
    path = write_gguf(f"{pre}.gguf", pre=pre, add_bos=True)
    ours, reference = load_tokenizer(path), load_reference(path)
    for text in FIXED_TEXTS:
        assert ours.encode(text) == reference.encode(text, add_special_tokens=True), text
    assert ours.encode("Hi")[0] == 1 and ours.encode("Hi", add_special_tokens=False)[0] != 1


def test_user_defined_tokens_stay_whole_but_are_not_special(write_gguf, small_vocabulary) -> None:
    tokens = small_vocabulary["tokens"]
    word = tokens.index("ing")
    types = list(small_vocabulary["token_types"])
    types[word] = 4  # USER_DEFINED
    ours = load_tokenizer(write_gguf(token_types=types))
    assert ours.encode("singing") == [tokens.index("s"), word, word]
    assert ours.decode([word], skip_special_tokens=True) == "ing"


def test_lone_surrogates_are_rejected(embedded) -> None:
    with pytest.raises(ValidationError, match="not valid Unicode"):
        embedded.encode("a\ud800b")
