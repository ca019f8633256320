"""Rebuild a ``tokenizers.Tokenizer`` from the vocabulary inside a GGUF file.

Only metadata is read; the tensors stay on disk. The tokenizer is built the
way ``transformers`` builds it from the same file, so both encode every text
alike. Supported: the ``gpt2`` tokenizer model (byte-level BPE) with the
pre-tokenizers of the GPT-2, Llama 3 and Qwen2 families (see
:data:`PRE_TOKENIZER_SPLITS`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from hetero_core.errors import ConfigError
from hetero_core.gguf_header import read_gguf_header
from hetero_core.model_source import parse
from hetero_tokenizer_hf.spec import TokenizerSpec, install_bos_eos

GPT2_SPLIT = None  # ByteLevel's own GPT-2 regex
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: ``tokenizer.ggml.pre`` -> the regex that splits text into words before BPE.
#: ``smollm`` uses GPT-2's split, as ``transformers`` does for a GGUF file
#: (SmolLM's own tokenizer.json also isolates every digit; its vocabulary has
#: no multi-digit token, so only digits after a run of spaces differ).
PRE_TOKENIZER_SPLITS: dict[str, str | None] = {
    "default": GPT2_SPLIT,
    "gpt2": GPT2_SPLIT,
    "smollm": GPT2_SPLIT,
    "llama3": LLAMA3_SPLIT,
    "llama-v3": LLAMA3_SPLIT,
    "llama-bpe": LLAMA3_SPLIT,
    "smaug-bpe": LLAMA3_SPLIT,
    "dbrx": LLAMA3_SPLIT,
    "falcon3": LLAMA3_SPLIT,
    "qwen2": QWEN2_SPLIT,
    "deepseek-r1-qwen": QWEN2_SPLIT,
}


def gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves,
    the rest shift past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [byte for byte in range(256) if byte not in printable]
    return {**{byte: chr(byte) for byte in printable}, **{byte: chr(256 + n) for n, byte in enumerate(shifted)}}


class GGUFMetadata:
    """The ``tokenizer.*`` keys of a GGUF file (only its header is read)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._header = parse(read_gguf_header, path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read GGUF file {str(path)!r}: {exc}", param="tokenizer") from exc

    def get(self, key: str, default: Any = None) -> Any:
        return self._header.get(key, default)

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ConfigError(f"{self.path.name}: GGUF metadata has no {key!r}", param="tokenizer")
        return value


def _pre_tokenizer(pre: str, path: Path) -> pre_tokenizers.PreTokenizer:
    if pre not in PRE_TOKENIZER_SPLITS:
        raise ConfigError(
            f"{path.name}: GGUF pre-tokenizer {pre!r} is not supported; supported: {sorted(PRE_TOKENIZER_SPLITS)}."
            " Point the tokenizer's 'path' option at the model's tokenizer.json instead",
            param="tokenizer",
        )
    split = PRE_TOKENIZER_SPLITS[pre]
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _byte_level_tokenizer(metadata: GGUFMetadata) -> Tokenizer:
    """Byte-level BPE with the file's tokens, merges and special tokens."""
    tokens: list[str] = metadata.require("tokenizer.ggml.tokens")
    merges: list[str] = metadata.require("tokenizer.ggml.merges")
    token_types: list[int] = metadata.get("tokenizer.ggml.token_type") or [gguf.TokenType.NORMAL] * len(tokens)
    control, user_defined = int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED)  # plain ints compare faster
    alphabet = gpt2_byte_alphabet()
    spelled = set(alphabet.values())

    def spell(token: str) -> str:  # a token written in plain text instead of the byte alphabet
        return token if spelled.issuperset(token) else "".join(alphabet[byte] for byte in token.encode("utf-8"))

    vocab = {spell(token): index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(merge.split(" ")) for merge in merges], fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre", "default"), metadata.path)
    tokenizer.decoder = decoders.ByteLevel()
    # Control tokens match whole and are special; user-defined ones match whole but are ordinary text.
    # A control token outside the byte alphabet is a mislabelled ordinary token: left to BPE.
    tokenizer.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False)
            for token, kind in zip(tokens, token_types, strict=True)
            if kind == control and spelled.issuperset(token)
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(token, special=False, normalized=False)
            for token, kind in zip(tokens, token_types, strict=True)
            if kind == user_defined and token in vocab
        ]
    )
    return tokenizer


TOKENIZER_BUILDERS = {"gpt2": _byte_level_tokenizer}


def read_gguf_tokenizer(path: Path) -> TokenizerSpec:
    """The tokenizer, special ids and chat template described by the GGUF file at ``path``."""
    metadata = GGUFMetadata(path)
    model = metadata.get("tokenizer.ggml.model")
    if model not in TOKENIZER_BUILDERS:
        raise ConfigError(
            f"{path.name}: GGUF tokenizer model {model!r} is not supported (supported: {sorted(TOKENIZER_BUILDERS)});"
            " point the tokenizer's 'path' option at the model's tokenizer.json instead",
            param="tokenizer",
        )
    tokenizer = TOKENIZER_BUILDERS[model](metadata)
    bos_token_id = metadata.get("tokenizer.ggml.bos_token_id")
    eos_token_id = metadata.get("tokenizer.ggml.eos_token_id")
    install_bos_eos(
        tokenizer,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
    )
    return TokenizerSpec(
        tokenizer=tokenizer,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
        unk_token_id=metadata.get("tokenizer.ggml.unknown_token_id"),
        chat_template=metadata.get("tokenizer.chat_template"),
    )
