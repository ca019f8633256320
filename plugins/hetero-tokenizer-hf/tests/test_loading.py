"""Loading from a GGUF file, a tokenizer.json or a Hugging Face folder, and the errors on the way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_core.model_source import resolve_model_path
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_tokenizer_hf import load_tokenizer, plugin

TEXT = "Hello 🌍 world, <|im_start|>user\n12  34"


def write_folder(folder: Path, embedded, **files: dict) -> Path:
    """``tokenizer.json`` from the embedded tokenizer plus the given JSON files (name without .json -> content)."""
    embedded.backend.save(str(folder / "tokenizer.json"))
    for name, content in files.items():
        (folder / f"{name}.json").write_text(json.dumps(content))
    return folder


def test_a_folder_gives_special_tokens_and_chat_template(embedded, tmp_path: Path) -> None:
    write_folder(
        tmp_path,
        embedded,
        tokenizer_config={
            "bos_token": "<|im_start|>",
            "eos_token": {"content": "<|im_end|>", "special": True},
            "unk_token": "<|endoftext|>",
            "chat_template": "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}{{ unk_token }}",
        },
    )
    folder = load_tokenizer(tmp_path)
    assert (folder.bos_token_id, folder.eos_token_id, folder.pad_token_id) == (1, 2, None)
    assert folder.vocab_size == embedded.vocab_size
    assert folder.encode(TEXT) == embedded.encode(TEXT)
    assert folder.apply_chat_template([{"role": "user", "content": "hey"}]) == "<|im_start|>hey<|im_end|><|endoftext|>"
    assert load_tokenizer(tmp_path / "tokenizer.json").encode(TEXT) == embedded.encode(TEXT)


def test_ids_fall_back_to_generation_and_model_config(embedded, tmp_path: Path) -> None:
    write_folder(
        tmp_path, embedded, generation_config={"eos_token_id": [2, 0]}, config={"bos_token_id": 1, "pad_token_id": 0}
    )
    (tmp_path / "chat_template.jinja").write_text("{{ messages | length }}")
    folder = load_tokenizer(tmp_path)
    assert (folder.bos_token_id, folder.eos_token_id, folder.pad_token_id) == (1, 2, 0)
    assert folder.apply_chat_template([{"role": "user", "content": "a"}]) == "1"


def test_named_chat_templates_use_the_default(embedded, tmp_path: Path) -> None:
    templates = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]
    write_folder(tmp_path, embedded, tokenizer_config={"chat_template": templates})
    assert load_tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "a"}]) == "plain"


@pytest.mark.parametrize(
    ("flags", "expected"), [({}, []), ({"add_bos_token": True}, [1]), ({"add_eos_token": True}, [2])]
)
def test_bos_and_eos_flags_of_a_folder(embedded, tmp_path: Path, flags: dict, expected: list[int]) -> None:
    write_folder(tmp_path, embedded, tokenizer_config={"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", **flags})
    ids = load_tokenizer(tmp_path).encode("hi")
    plain = embedded.encode("hi", add_special_tokens=False)
    assert ids == ([*expected, *plain] if expected != [2] else [*plain, 2])


def plugin_manager():
    """A plugin manager holding only this plugin."""
    pm = create_plugin_manager(entry_points=False, builtin=False)
    pm.register(plugin, name="huggingface")
    return pm


def test_the_factory_loads_the_configured_model_or_the_path_option(embedded, tmp_path: Path) -> None:
    registry = ComponentRegistry(plugin_manager())
    from_model = registry.create("tokenizer", "huggingface", {}, EngineConfig(model=str(resolve_model_path(None))))
    assert from_model.encode(TEXT) == embedded.encode(TEXT)
    write_folder(tmp_path, embedded)
    from_path = registry.create("tokenizer", "huggingface", {"path": str(tmp_path)}, EngineConfig())
    assert from_path.encode(TEXT) == embedded.encode(TEXT)


def test_a_missing_path_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as error:
        plugin.create(EngineConfig(), path=str(tmp_path / "missing.gguf"))
    assert error.value.param == "tokenizer.path"


def test_a_folder_without_tokenizer_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no tokenizer at"):
        load_tokenizer(tmp_path)


def test_a_malformed_tokenizer_json_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        load_tokenizer(tmp_path)


def test_a_file_that_is_not_gguf_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ConfigError, match="cannot read GGUF file"):
        load_tokenizer(tmp_path / "model.gguf")


def test_an_unsupported_tokenizer_model_is_named(write_gguf) -> None:
    with pytest.raises(ConfigError, match="tokenizer model 'bert' is not supported"):
        load_tokenizer(write_gguf(model="bert"))


def test_an_unsupported_pre_tokenizer_is_named(write_gguf) -> None:
    with pytest.raises(ConfigError, match="pre-tokenizer 'starcoder' is not supported"):
        load_tokenizer(write_gguf(pre="starcoder"))


def test_save_pretrained_writes_a_folder_that_loads_as_the_same_tokenizer(embedded, tmp_path: Path) -> None:
    written = embedded.save_pretrained(tmp_path / "export")
    assert written == [tmp_path / "export" / "tokenizer.json", tmp_path / "export" / "tokenizer_config.json"]
    config = json.loads(written[1].read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["clean_up_tokenization_spaces"] is False
    assert (config["bos_token"], config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    reloaded = load_tokenizer(tmp_path / "export")
    text = "Hello, wörld <|im_end|> 🙂"
    assert reloaded.encode(text) == embedded.encode(text)
    assert (reloaded.bos_token_id, reloaded.eos_token_id, reloaded.vocab_size) == (
        embedded.bos_token_id,
        embedded.eos_token_id,
        embedded.vocab_size,
    )
    chat = [{"role": "user", "content": "Hi"}]
    assert reloaded.apply_chat_template(chat) == embedded.apply_chat_template(chat)
