"""Rebuild a Hugging Face ``tokenizers.Tokenizer`` from the vocabulary inside a GGUF file.

Only the metadata is read (the tensors stay on disk). Supported: the
``gpt2`` tokenizer model (byte-level BPE) with the pre-tokenizers that
llama.cpp names ``default``/``gpt2``, ``smollm`` and ``llama-bpe``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from hetero_core.errors import ConfigError

CONTROL, USER_DEFINED = 3, 4  # gguf token types that are special tokens

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@attrs.frozen
class TokenizerFiles:
    """What a GGUF file says about its tokenizer."""

    tokenizer: Tokenizer
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool
    chat_template: str | None


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _pre_tokenizer(pre: str | None) -> Any:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in (None, "default", "gpt2"):
        return byte_level
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre == "llama-bpe":
        split = pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated")
        return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise ConfigError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: gpt2, smollm, llama-bpe", param="tokenizer")


def read_gguf_tokenizer(path: Path) -> TokenizerFiles:
    reader = gguf.GGUFReader(path)
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ConfigError(
            f"{path.name}: tokenizer model {model!r} is not supported (only byte-level BPE, 'gpt2');"
            " point the tokenizer's 'path' option at a tokenizer.json instead",
            param="tokenizer",
        )
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    merges: list[str] = _field(reader, "tokenizer.ggml.merges") or []
    types: list[int] = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    bpe = models.BPE(
        vocab={token: index for index, token in enumerate(tokens)},
        merges=[tuple(merge.split(" ", 1)) for merge in merges],
        fuse_unk=False,
        ignore_merges=_field(reader, "tokenizer.ggml.pre") == "llama-bpe",
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i, kind in enumerate(types) if kind in (CONTROL, USER_DEFINED)]
    )
    add_bos = _field(reader, "tokenizer.ggml.add_bos_token")
    return TokenizerFiles(
        tokenizer=tokenizer,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"),
        add_bos_token=bool(add_bos) if add_bos is not None else False,
        chat_template=_field(reader, "tokenizer.chat_template"),
    )
