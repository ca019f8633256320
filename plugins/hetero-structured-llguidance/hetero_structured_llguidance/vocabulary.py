"""The tokenizer's vocabulary as llguidance needs it: every token's bytes."""

from __future__ import annotations

from typing import Any

import llguidance

from hetero_core.errors import ConfigError
from hetero_core.protocols import Tokenizer


class _ByteVocabulary:
    """What ``llguidance.LLTokenizer`` reads from a tokenizer that lists its tokens' bytes."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokens = list(tokenizer.token_bytes())
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = [
            token_id for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
            if token_id is not None
        ]
        self._encode = tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text, add_special_tokens=False)


def llguidance_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """Build llguidance's view of ``tokenizer``'s vocabulary (it walks every token: build it once).

    Two kinds of tokenizer qualify: one built on the ``tokenizers`` library,
    exposing it as ``backend`` (the ``huggingface`` tokenizer), and one with a
    ``token_bytes()`` method listing each token id's bytes (the ``simple`` one).
    """
    if tokenizer.eos_token_id is None:
        raise ConfigError("structured output needs a tokenizer with an end-of-sequence token", param="structured_output")
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "to_str"):
        return llguidance.LLTokenizer(backend.to_str(), n_vocab=tokenizer.vocab_size, eos_token=tokenizer.eos_token_id)
    if hasattr(tokenizer, "token_bytes"):
        return llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_ByteVocabulary(tokenizer)),
            n_vocab=tokenizer.vocab_size,
            eos_token=tokenizer.eos_token_id,
        )
    raise ConfigError(
        f"the llguidance structured-output backend cannot read the vocabulary of {type(tokenizer).__name__}: "
        "it needs a tokenizer built on the `tokenizers` library (a `backend` attribute) or a `token_bytes()` method",
        param="structured_output",
    )
