"""Read a Hugging Face model folder's tokenizer: ``tokenizer.json`` plus the JSON files around it.

Special tokens come from ``tokenizer_config.json`` first, then
``generation_config.json``, then ``config.json``. The chat template comes
from ``tokenizer_config.json`` or ``chat_template.jinja``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from hetero_core.errors import ConfigError
from hetero_tokenizer_hf.spec import TokenizerSpec, install_bos_eos


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}", param="tokenizer") from exc
    return content if isinstance(content, dict) else {}


def _token_id(tokenizer: Tokenizer, value: Any) -> int | None:
    """A special token given as a string, an AddedToken-like dict, an id or a list of ids (the first counts)."""
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, str):
        return tokenizer.token_to_id(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _chat_template(folder: Path, settings: dict[str, Any]) -> str | None:
    """The default chat template; a list of named templates yields the one named ``default``."""
    template = settings.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    return template if isinstance(template, str) else None


def read_folder_tokenizer(folder: Path, tokenizer_file: Path) -> TokenizerSpec:
    """The tokenizer in ``tokenizer_file`` with the special tokens and chat template of ``folder``."""
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # the Rust library raises plain Exception for a malformed file
        raise ConfigError(f"cannot load tokenizer {str(tokenizer_file)!r}: {exc}", param="tokenizer") from exc
    settings = _read_json(folder / "tokenizer_config.json")
    generation = _read_json(folder / "generation_config.json")
    model_config = _read_json(folder / "config.json")

    def special(name: str) -> int | None:
        candidates = (
            settings.get(f"{name}_token"),
            generation.get(f"{name}_token_id"),
            model_config.get(f"{name}_token_id"),
        )
        for value in candidates:
            token_id = _token_id(tokenizer, value)
            if token_id is not None:
                return token_id
        return None

    bos_token_id, eos_token_id = special("bos"), special("eos")
    # Like transformers: explicit flags (or no post-processor at all) decide the BOS/EOS added on encode;
    # otherwise tokenizer.json's own post-processor does.
    if "add_bos_token" in settings or "add_eos_token" in settings or tokenizer.post_processor is None:
        install_bos_eos(
            tokenizer,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            add_bos=bool(settings.get("add_bos_token", False)),
            add_eos=bool(settings.get("add_eos_token", False)),
        )
    return TokenizerSpec(
        tokenizer=tokenizer,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=special("pad"),
        unk_token_id=special("unk"),
        chat_template=_chat_template(folder, settings),
    )
