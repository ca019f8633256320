"""The tokenizer's vocabulary as llguidance needs it: every token's bytes, control tokens marked."""

from __future__ import annotations

import llguidance

from hetero_core.errors import ConfigError
from hetero_core.protocols import Tokenizer


class _ByteVocabulary:
    """What ``llguidance.TokenizerWrapper`` reads: tokens' bytes, the control tokens, and an encoder."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokens = list(tokenizer.token_bytes())
        if len(self.tokens) != tokenizer.vocab_size:
            raise ConfigError(
                f"{type(tokenizer).__name__}.token_bytes() lists {len(self.tokens)} tokens, "
                f"its vocab_size is {tokenizer.vocab_size}",
                param="tokenizer",
            )
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = sorted(tokenizer.special_token_ids)
        self._encode = tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text, add_special_tokens=False)


def llguidance_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """Build llguidance's view of ``tokenizer``'s vocabulary (it walks every token: build it once)."""
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            "structured output needs a tokenizer with an end-of-sequence token", param="structured_output"
        )
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(_ByteVocabulary(tokenizer)),
        n_vocab=tokenizer.vocab_size,
        eos_token=tokenizer.eos_token_id,
    )
