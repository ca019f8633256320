"""Fixtures: the embedded SmolLM2 tokenizer, transformers' tokenizer for the same file, and small GGUF files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import gguf
import pytest

from hetero_core.model_source import resolve_model_path
from hetero_tokenizer_hf import HuggingFaceTokenizer, load_tokenizer
from hetero_tokenizer_hf.gguf_vocab import GGUFMetadata

EMBEDDED_MODEL = resolve_model_path(None)
NUM_SMALL_VOCAB_TOKENS = 6000  # SmolLM2's first tokens: the control tokens, all 256 bytes and common words


def _load_reference(path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="session")
def load_reference() -> Callable[[Path], Any]:
    """Load transformers' tokenizer for a GGUF file."""
    return _load_reference


@pytest.fixture(scope="session")
def embedded() -> HuggingFaceTokenizer:
    return load_tokenizer(EMBEDDED_MODEL)


@pytest.fixture(scope="session")
def reference() -> Any:
    return _load_reference(EMBEDDED_MODEL)


@pytest.fixture(scope="session")
def small_vocabulary() -> dict[str, Any]:
    """A self-contained slice of SmolLM2's vocabulary: its first tokens and the merges among them.

    One more token, ``12``, makes digit grouping visible (SmolLM2 has no multi-digit token).
    """
    metadata = GGUFMetadata(EMBEDDED_MODEL)
    tokens = metadata.get("tokenizer.ggml.tokens")[:NUM_SMALL_VOCAB_TOKENS]
    known = set(tokens)
    merges = [
        merge
        for merge in metadata.get("tokenizer.ggml.merges")
        if (parts := merge.split(" ")) and parts[0] in known and parts[1] in known and "".join(parts) in known
    ]
    return {
        "tokens": [*tokens, "12"],
        "merges": [*merges, "1 2"],
        "token_types": [*metadata.get("tokenizer.ggml.token_type")[:NUM_SMALL_VOCAB_TOKENS], gguf.TokenType.NORMAL],
        "chat_template": metadata.get("tokenizer.chat_template"),
    }


@pytest.fixture
def write_gguf(tmp_path: Path, small_vocabulary: dict[str, Any]) -> Callable[..., Path]:
    """Write a tensor-less GGUF file with the small vocabulary; keyword arguments change its tokenizer metadata."""

    def write(
        name: str = "model.gguf",
        *,
        model: str = "gpt2",
        pre: str = "smollm",
        add_bos: bool = False,
        token_types: list[int] | None = None,
        chat_template: str | None = None,
    ) -> Path:
        path = tmp_path / name
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_context_length(512)
        writer.add_block_count(1)
        writer.add_embedding_length(64)
        writer.add_feed_forward_length(128)
        writer.add_head_count(2)
        writer.add_head_count_kv(2)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(len(small_vocabulary["tokens"]))
        writer.add_tokenizer_model(model)
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(small_vocabulary["tokens"])
        writer.add_token_types(token_types or small_vocabulary["token_types"])
        writer.add_token_merges(small_vocabulary["merges"])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_pad_token_id(2)
        writer.add_add_bos_token(add_bos)
        writer.add_chat_template(chat_template or small_vocabulary["chat_template"])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    return write
