"""The huggingface tokenizer against transformers' own, on the embedded SmolLM2 GGUF."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings, strategies as st

from hetero_core.errors import ConfigError
from hetero_core.model_source import resolve_model_path
from hetero_core.testing import TokenizerContract
from hetero_core.testing.tokenizer import SAMPLE_TEXTS
from hetero_tokenizer_hf import load_tokenizer

MODEL = resolve_model_path(None)

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Hello!"}],
    [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Leaves fall slowly down"},
        {"role": "user", "content": "Another one, about the sea 🌊"},
    ],
]


@pytest.fixture(scope="module")
def ours():
    return load_tokenizer(MODEL)


@pytest.fixture(scope="module")
def reference():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(MODEL.parent), gguf_file=MODEL.name)


class TestHuggingFaceContract(TokenizerContract):
    @pytest.fixture
    def tokenizer(self, ours):
        return ours


def test_special_ids_follow_the_model(ours) -> None:
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.vocab_size) == (1, 2, 2, 49152)
    assert ours.encode("hi") == ours.encode("hi", add_special_tokens=False)  # add_bos_token is false


@pytest.mark.parametrize("text", [*SAMPLE_TEXTS, "<|im_start|>user\nhi<|im_end|>", "x" * 300, "   ", "a\r\nb", "1,000.50$"])
def test_encoding_matches_transformers(ours, reference, text: str) -> None:
    assert ours.encode(text) == reference.encode(text, add_special_tokens=True)


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=80))
def test_encoding_matches_transformers_on_any_text(ours, reference, text: str) -> None:
    assert ours.encode(text) == reference.encode(text, add_special_tokens=True)


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(ours, reference, messages, add_generation_prompt: bool) -> None:
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected


@settings(max_examples=100, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=60), st.randoms())
def test_streaming_in_random_chunks_matches_the_full_decode(ours, text: str, rng: random.Random) -> None:
    ids = ours.encode(text)
    detokenizer = ours.new_detokenizer(ours.encode("Prompt"))
    pieces, start = [], 0
    while start < len(ids):
        size = rng.randint(1, 4)
        pieces.append(detokenizer.add(ids[start : start + size]))
        start += size
    pieces.append(detokenizer.finish())
    assert "".join(pieces) == ours.decode(ids)
    if "\ufffd" not in ours.decode(ids):  # bytes missing from the vocabulary decode as U+FFFD
        assert all("\ufffd" not in piece for piece in pieces)


def test_loads_from_a_hugging_face_folder(ours, tmp_path) -> None:
    ours.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "chat_template": "{{ messages[0]['content'] }}!"})
    )
    folder = load_tokenizer(tmp_path)
    assert (folder.eos_token_id, folder.bos_token_id, folder.pad_token_id) == (2, 1, 2)
    assert folder.encode("Hello 🌍 world") == ours.encode("Hello 🌍 world")
    assert folder.apply_chat_template([{"role": "user", "content": "hey"}]) == "hey!"


def test_missing_tokenizer_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no tokenizer at"):
        load_tokenizer(tmp_path)
