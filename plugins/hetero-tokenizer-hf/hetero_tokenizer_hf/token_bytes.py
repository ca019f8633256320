"""Every token's bytes, read from how the ``tokenizers`` decoder spells tokens.

Two spellings cover the models this plugin loads: byte-level BPE (GPT-2,
Llama 3, Qwen2, SmolLM: each byte written as one printable character, see
:func:`~hetero_tokenizer_hf.gguf_vocab.gpt2_byte_alphabet`) and SentencePiece
(``▁`` for a space, ``<0xAB>`` for a byte without a token of its own). Added
tokens (control or user-defined) stand for their text as written.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from tokenizers import Tokenizer

from hetero_core.errors import ConfigError
from hetero_tokenizer_hf.gguf_vocab import gpt2_byte_alphabet

SENTENCEPIECE_SPACE = "\u2581"
BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
#: Decoders that spell tokens in SentencePiece's way.
SENTENCEPIECE_DECODERS = frozenset({"Metaspace", "ByteFallback", "Replace"})


def _decoder_types(decoder: dict[str, Any] | None) -> set[str]:
    if decoder is None:
        return set()
    if decoder["type"] == "Sequence":
        return set().union(*(_decoder_types(step) for step in decoder["decoders"]))
    return {decoder["type"]}


def _byte_level_speller() -> Callable[[str], bytes]:
    """A character outside the byte alphabet (a token written in plain text) stands for its UTF-8 bytes."""
    to_byte = {char: bytes((byte,)) for byte, char in gpt2_byte_alphabet().items()}
    return lambda token: b"".join(to_byte.get(char) or char.encode("utf-8") for char in token)


def _sentencepiece_speller(token: str) -> bytes:
    if match := BYTE_FALLBACK.fullmatch(token):
        return bytes((int(match.group(1), 16),))
    return token.replace(SENTENCEPIECE_SPACE, " ").encode("utf-8")


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """The bytes of each token id in ``[0, vocab_size)``; an id without a token has none (``b""``).

    Raises ``ConfigError`` for a decoder whose spelling is neither of the two.
    """
    decoder_types = _decoder_types(json.loads(tokenizer.to_str()).get("decoder"))
    if "ByteLevel" in decoder_types:
        spell = _byte_level_speller()
    elif decoder_types & SENTENCEPIECE_DECODERS:
        spell = _sentencepiece_speller
    else:
        raise ConfigError(
            "cannot tell the bytes of this tokenizer's tokens: its decoder "
            f"({sorted(decoder_types) or 'none'}) is neither "
            f"ByteLevel nor SentencePiece-style ({sorted(SENTENCEPIECE_DECODERS)})",
            param="tokenizer",
        )
    added = {token_id: token.content for token_id, token in tokenizer.get_added_tokens_decoder().items()}
    spelled = []
    for token_id in range(tokenizer.get_vocab_size(with_added_tokens=True)):
        if token_id in added:
            spelled.append(added[token_id].encode("utf-8"))
        else:
            token = tokenizer.id_to_token(token_id)
            spelled.append(b"" if token is None else spell(token))
    return spelled
