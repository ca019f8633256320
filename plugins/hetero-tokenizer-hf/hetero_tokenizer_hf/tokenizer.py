"""The ``huggingface`` tokenizer: a ``tokenizers.Tokenizer`` plus the model's special ids and chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from hetero_core.errors import ConfigError, ValidationError
from hetero_core.messages import check_messages
from hetero_tokenizer_hf.chat_template import ChatTemplate
from hetero_tokenizer_hf.gguf_vocab import TokenizerFiles, read_gguf_tokenizer


class StreamingDetokenizer:
    """Incremental decoding on ``tokenizers``' ``DecodeStream``: O(1) work per token.

    Tokens that end inside a UTF-8 character are held until the character
    completes; :meth:`finish` decodes whatever is still held.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stream = DecodeStream(ids=list(prompt_token_ids[-8:]), skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []

    def add(self, token_ids: Sequence[int]) -> str:
        pieces = []
        for token_id in token_ids:
            piece = self._stream.step(self._tokenizer, token_id)
            if piece is None:
                self._held.append(token_id)
            else:
                self._held.clear()
                pieces.append(piece)
        return "".join(pieces)

    def finish(self) -> str:
        held, self._held = self._held, []
        return self._tokenizer.decode(held, skip_special_tokens=self._skip_special_tokens) if held else ""


class HuggingFaceTokenizer:
    """Implements :class:`hetero_core.protocols.Tokenizer` over the Rust ``tokenizers`` library."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        pad_token_id: int | None,
        add_bos_token: bool,
        chat_template: str | None,
    ) -> None:
        self._tokenizer = tokenizer
        self._bos_token_id = bos_token_id
        self._eos_token_id = eos_token_id
        self._pad_token_id = pad_token_id
        self._add_bos_token = add_bos_token and bos_token_id is not None
        token = tokenizer.id_to_token
        self._chat_template = (
            ChatTemplate(
                chat_template,
                bos_token=token(bos_token_id) if bos_token_id is not None else "",
                eos_token=token(eos_token_id) if eos_token_id is not None else "",
            )
            if chat_template
            else None
        )

    @property
    def backend(self) -> Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_token_id

    @property
    def pad_token_id(self) -> int | None:
        return self._pad_token_id

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return [self._bos_token_id, *ids] if add_special_tokens and self._add_bos_token else ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def new_detokenizer(self, prompt_token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> StreamingDetokenizer:
        return StreamingDetokenizer(self._tokenizer, prompt_token_ids, skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        if self._chat_template is None:
            check_messages(messages)
            raise ValidationError("this model has no chat template; send a plain prompt instead", param="messages")
        return self._chat_template.render(messages, add_generation_prompt=add_generation_prompt)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_id(tokenizer: Tokenizer, value: Any) -> int | None:
    """A special token given as an id, a string, or an AddedToken-like dict."""
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, str):
        return tokenizer.token_to_id(value)
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) else None


def _from_folder(folder: Path, tokenizer_file: Path) -> TokenizerFiles:
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    settings = _read_json(folder / "tokenizer_config.json")
    model_config = _read_json(folder / "config.json")
    generation = _read_json(folder / "generation_config.json")

    def special(name: str) -> int | None:
        for source in (settings.get(f"{name}_token"), generation.get(f"{name}_token_id"), model_config.get(f"{name}_token_id")):
            token_id = _token_id(tokenizer, source)
            if token_id is not None:
                return token_id
        return None

    template = settings.get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    eos = special("eos")
    return TokenizerFiles(
        tokenizer=tokenizer,
        bos_token_id=special("bos"),
        eos_token_id=eos,
        pad_token_id=special("pad") if special("pad") is not None else eos,
        add_bos_token=bool(settings.get("add_bos_token", False)),
        chat_template=template if isinstance(template, str) else None,
    )


def load_tokenizer(path: str | Path) -> HuggingFaceTokenizer:
    """Load from a GGUF file, a ``tokenizer.json`` or a folder holding one."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        files = read_gguf_tokenizer(path)
    elif path.is_file() and path.suffix == ".json":
        files = _from_folder(path.parent, path)
    elif path.is_dir() and (path / "tokenizer.json").is_file():
        files = _from_folder(path, path / "tokenizer.json")
    else:
        raise ConfigError(f"no tokenizer at {str(path)!r}: expected a .gguf file, a tokenizer.json or a folder with one", param="tokenizer")
    return HuggingFaceTokenizer(
        files.tokenizer,
        bos_token_id=files.bos_token_id,
        eos_token_id=files.eos_token_id,
        pad_token_id=files.pad_token_id,
        add_bos_token=files.add_bos_token,
        chat_template=files.chat_template,
    )
