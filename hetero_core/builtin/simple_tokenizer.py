"""A byte-level tokenizer: one token per UTF-8 byte, plus three control tokens.

It round-trips any text exactly and needs no files, which makes it the
tokenizer of the core's tests and of the mock executor.
"""

from __future__ import annotations

import codecs
from typing import Any, Mapping, Sequence

import attrs

from hetero_core.errors import ConfigError, ValidationError
from hetero_core.messages import check_messages
from hetero_core.tool_prompt import inline_tools
from hetero_core.validators import boolean

NUM_BYTES = 256


class SimpleDetokenizer:
    """Streams bytes back to text, holding the bytes of an unfinished character."""

    def __init__(self, skip_special_tokens: bool) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._skip_special_tokens = skip_special_tokens

    def add(self, token_ids: Sequence[int]) -> str:
        text = []
        for token_id in token_ids:
            if token_id < NUM_BYTES:
                text.append(self._decoder.decode(bytes((token_id,))))
            elif not self._skip_special_tokens:
                text.append(self._decoder.decode(b"", final=True) + SimpleTokenizer.SPECIAL_TEXT[token_id])
                self._decoder.reset()
        return "".join(text)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)


@attrs.frozen
class SimpleTokenizerOptions:
    """The ``simple`` tokenizer's options."""

    add_bos: bool = attrs.field(default=False, validator=boolean(error=ConfigError))


class SimpleTokenizer:
    """Token ``b`` is byte ``b`` for b < 256; then BOS, EOS and PAD.

    ``config`` (the engine's, when built as a component) is not needed.
    """

    BOS, EOS, PAD = NUM_BYTES, NUM_BYTES + 1, NUM_BYTES + 2
    SPECIAL_TEXT = {BOS: "<s>", EOS: "</s>", PAD: "<pad>"}

    def __init__(self, config: Any = None, *, add_bos: bool = False) -> None:
        self._add_bos = add_bos

    @property
    def vocab_size(self) -> int:
        return NUM_BYTES + 3

    @property
    def bos_token_id(self) -> int:
        return self.BOS

    @property
    def eos_token_id(self) -> int:
        return self.EOS

    @property
    def pad_token_id(self) -> int:
        return self.PAD

    @property
    def special_token_ids(self) -> frozenset[int]:
        return frozenset(self.SPECIAL_TEXT)

    def token_bytes(self) -> list[bytes]:
        """Byte ``b`` for token ``b``; the control tokens as their text."""
        return [bytes((b,)) for b in range(NUM_BYTES)] + [
            self.SPECIAL_TEXT[t].encode() for t in (self.BOS, self.EOS, self.PAD)
        ]

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        try:
            ids = list(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ValidationError(f"text is not valid Unicode: {exc.reason}", param="prompt") from exc
        return [self.BOS, *ids] if add_special_tokens and self._add_bos else ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        detokenizer = SimpleDetokenizer(skip_special_tokens)
        return detokenizer.add(token_ids) + detokenizer.finish()

    def new_detokenizer(
        self, prompt_token_ids: Sequence[int], *, skip_special_tokens: bool = True
    ) -> SimpleDetokenizer:
        return SimpleDetokenizer(skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """``role: content`` lines; tools in the default convention; ``template_kwargs`` have no variable to fill
        here."""
        check_messages(messages)
        plain = inline_tools(messages, tools)
        text = "".join(f"{message['role']}: {message['content']}\n" for message in plain)
        if continue_final_message:
            return text[:-1]
        return text + "assistant: " if add_generation_prompt else text
