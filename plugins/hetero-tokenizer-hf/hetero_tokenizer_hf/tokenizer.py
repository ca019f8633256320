"""The ``huggingface`` tokenizer: a ``tokenizers.Tokenizer`` plus the model's special ids and chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from tokenizers import Tokenizer

from hetero_core.errors import ConfigError, ValidationError
from hetero_core.messages import check_messages
from hetero_tokenizer_hf.chat_template import ChatTemplate
from hetero_tokenizer_hf.detokenizer import StreamingDetokenizer
from hetero_tokenizer_hf.gguf_vocab import read_gguf_tokenizer
from hetero_tokenizer_hf.hf_folder import read_folder_tokenizer
from hetero_tokenizer_hf.spec import TokenizerSpec
from hetero_tokenizer_hf.token_bytes import token_bytes


class HuggingFaceTokenizer:
    """Implements :class:`hetero_core.protocols.Tokenizer`; encode and decode go straight to the Rust library."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self._tokenizer = spec.tokenizer
        self._bos_token_id = spec.bos_token_id
        self._eos_token_id = spec.eos_token_id
        self._pad_token_id = spec.pad_token_id
        self._special_token_ids = frozenset(
            token_id for token_id, token in spec.tokenizer.get_added_tokens_decoder().items() if token.special
        )
        self._control_token_ids = self._special_token_ids | {
            token_id for token_id in (spec.bos_token_id, spec.eos_token_id, spec.pad_token_id) if token_id is not None
        }
        self._token_bytes: list[bytes] | None = None
        special_tokens = {
            f"{name}_token": spec.tokenizer.id_to_token(token_id)
            for name, token_id in (
                ("bos", spec.bos_token_id),
                ("eos", spec.eos_token_id),
                ("unk", spec.unk_token_id),
                ("pad", spec.pad_token_id),
            )
            if token_id is not None
        }
        self._chat_template = (
            ChatTemplate(spec.chat_template, special_tokens=special_tokens) if spec.chat_template else None
        )
        self._special_tokens = special_tokens
        self._chat_template_source = spec.chat_template

    @property
    def backend(self) -> Tokenizer:
        """The underlying ``tokenizers.Tokenizer`` (its ``save`` writes a tokenizer.json)."""
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

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._control_token_ids

    def token_bytes(self) -> list[bytes]:
        """Read from the vocabulary on the first call (it walks every token), then kept."""
        if self._token_bytes is None:
            self._token_bytes = token_bytes(self._tokenizer)
        return self._token_bytes

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        try:
            return self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[
                0
            ].ids  # encode() holds the GIL throughout
        except TypeError as exc:
            raise ValidationError(f"text is not valid Unicode (a lone surrogate?): {exc}", param="prompt") from exc

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def new_detokenizer(
        self, prompt_token_ids: Sequence[int], *, skip_special_tokens: bool = True
    ) -> StreamingDetokenizer:
        return StreamingDetokenizer(
            self._tokenizer,
            prompt_token_ids,
            special_token_ids=self._special_token_ids,
            skip_special_tokens=skip_special_tokens,
        )

    def save_pretrained(self, directory: str | Path) -> list[Path]:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory`` (created if missing);
        the paths written.

        ``transformers.AutoTokenizer.from_pretrained(directory)`` then encodes,
        decodes and renders chats as this tokenizer does: the BOS/EOS it adds is
        in tokenizer.json's post-processor, the special tokens and the chat
        template are in tokenizer_config.json, and decoding does no clean-up of
        spaces (as ``tokenizers`` does not).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tokenizer_file, config_file = directory / "tokenizer.json", directory / "tokenizer_config.json"
        self._tokenizer.save(str(tokenizer_file))
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": False,
            **self._special_tokens,
        }
        if self._chat_template_source:
            config["chat_template"] = self._chat_template_source
        config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return [tokenizer_file, config_file]

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        if self._chat_template is None:
            check_messages(messages)
            raise ValidationError("this model has no chat template; send a plain prompt instead", param="messages")
        return self._chat_template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            template_kwargs=template_kwargs,
        )


def load_tokenizer(path: str | Path, *, param: str = "tokenizer") -> HuggingFaceTokenizer:
    """Load from a GGUF file, a ``tokenizer.json``, or a folder holding one.

    ``param`` names the setting that gave ``path``, for the error messages.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise ConfigError(f"tokenizer path {str(path)!r} does not exist", param=param)
    if path.is_file() and path.suffix == ".gguf":
        spec = read_gguf_tokenizer(path)
    elif path.is_file() and path.suffix == ".json":
        spec = read_folder_tokenizer(path.parent, path)
    elif path.is_dir() and (path / "tokenizer.json").is_file():
        spec = read_folder_tokenizer(path, path / "tokenizer.json")
    else:
        raise ConfigError(
            f"no tokenizer at {str(path)!r}: expected a .gguf file, a tokenizer.json, "
            "or a folder holding a tokenizer.json",
            param=param,
        )
    return HuggingFaceTokenizer(spec)
