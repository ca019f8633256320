"""Token bytes read from byte-level and SentencePiece vocabularies; other spellings refused by name."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers

from hetero_core.errors import ConfigError
from hetero_tokenizer_hf import load_tokenizer
from hetero_tokenizer_hf.token_bytes import token_bytes


def _sentencepiece_tokenizer() -> Tokenizer:
    vocab = {
        "<unk>": 0,
        "<s>": 1,
        "</s>": 2,
        "<0x0A>": 3,
        "<0xE6>": 4,
        "\u2581hello": 5,
        "\u2581": 6,
        "h": 7,
        "ello": 8,
    }
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tokenizer


def test_byte_level_tokens_are_their_bytes(embedded) -> None:
    spelled = embedded.token_bytes()
    text = "naïve 日本 🌍\n\n  x"
    ids = embedded.encode(text, add_special_tokens=False)
    assert b"".join(spelled[token_id] for token_id in ids) == text.encode("utf-8")
    assert any(len(spelled[token_id]) == 1 and spelled[token_id][0] >= 0x80 for token_id in ids)  # part of a character
    assert spelled[embedded.eos_token_id] == embedded.backend.id_to_token(embedded.eos_token_id).encode()


def test_gguf_and_tokenizer_json_agree(embedded, tmp_path) -> None:
    embedded.backend.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path / "tokenizer.json").token_bytes() == embedded.token_bytes()


def test_sentencepiece_spaces_and_byte_fallback() -> None:
    spelled = token_bytes(_sentencepiece_tokenizer())
    assert spelled[3] == b"\n" and spelled[4] == b"\xe6"
    assert spelled[5] == b" hello" and spelled[6] == b" " and spelled[8] == b"ello"


def test_an_unknown_spelling_is_refused_by_name() -> None:
    tokenizer = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "word": 1}, unk_token="[UNK]"))
    tokenizer.decoder = decoders.WordPiece()
    with pytest.raises(ConfigError, match="WordPiece"):
        token_bytes(tokenizer)
