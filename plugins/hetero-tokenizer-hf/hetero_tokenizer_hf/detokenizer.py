"""Streaming detokenization on ``tokenizers``' ``DecodeStream``."""

from __future__ import annotations

from typing import AbstractSet, Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

#: How many prompt tokens precede the output as decoding context.
NUM_CONTEXT_TOKENS = 6


class StreamingDetokenizer:
    """Implements :class:`hetero_core.protocols.IncrementalDetokenizer`.

    ``DecodeStream`` (Rust) decodes only the tokens since its last emitted
    piece, and emits nothing while the text ends in an incomplete UTF-8
    character. Special tokens that are to be skipped never enter the stream,
    so a run of them costs nothing. The held-back tokens are remembered so
    :meth:`finish` can decode them (as U+FFFD, like the full decode does).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        *,
        special_token_ids: AbstractSet[int],
        skip_special_tokens: bool,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._skipped_ids = special_token_ids if skip_special_tokens else frozenset()
        context = self._kept(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        # A prompt that ends inside a character would glue the output's first bytes to it: no context then.
        if context and tokenizer.decode(context, skip_special_tokens=skip_special_tokens).endswith("\ufffd"):
            context = []
        self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []

    def _kept(self, token_ids: Sequence[int]) -> list[int]:
        return [token_id for token_id in token_ids if token_id not in self._skipped_ids]

    def add(self, token_ids: Sequence[int]) -> str:
        kept = self._kept(token_ids)
        if not kept:
            return ""
        piece = self._stream.step(self._tokenizer, kept)
        if piece is None:
            self._held.extend(kept)
            return ""
        self._held.clear()
        return piece

    def finish(self) -> str:
        held, self._held = self._held, []
        return self._tokenizer.decode(held, skip_special_tokens=self._skip_special_tokens) if held else ""
