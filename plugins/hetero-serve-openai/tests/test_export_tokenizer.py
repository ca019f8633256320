"""``hetero-infer export-tokenizer``: transformers, given the exported folder, tokenizes as the live server does."""

from __future__ import annotations

import json

import httpx
import pytest
from transformers import AutoTokenizer

from hetero_core.cli.main import main

pytestmark = [pytest.mark.model, pytest.mark.integration]  # the embedded model, through the installed plugins

TEXTS = [
    "The capital of France is Paris.",
    "  leading spaces, tabs\tand\nnew lines  ",
    "ünïcödé, 日本語 and an emoji 🙂",
    "<|im_start|>user\nspecial tokens in the text<|im_end|>",
    "",
]
CHATS = [
    [{"role": "user", "content": "Hi!"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ],
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, model_server) -> AutoTokenizer:
    directory = tmp_path_factory.mktemp("tokenizer")
    assert main(["export-tokenizer", str(directory)]) == 0  # the default model: the embedded GGUF's vocabulary
    assert sorted(path.name for path in directory.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    return AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("text", TEXTS)
def test_text_tokenizes_and_decodes_as_on_the_server(exported, model_server, text: str) -> None:
    for add_special_tokens in (True, False):
        served = httpx.post(
            f"{model_server.url}/tokenize", json={"prompt": text, "add_special_tokens": add_special_tokens}, timeout=60
        )
        assert exported.encode(text, add_special_tokens=add_special_tokens) == served.json()["tokens"]
    tokens = served.json()["tokens"]
    decoded = httpx.post(f"{model_server.url}/detokenize", json={"tokens": tokens}, timeout=60).json()["prompt"]
    assert exported.decode(tokens) == decoded


@pytest.mark.parametrize("messages", CHATS)
def test_the_chat_template_renders_as_on_the_server(exported, model_server, messages: list) -> None:
    served = httpx.post(f"{model_server.url}/tokenize", json={"messages": messages}, timeout=60).json()["tokens"]
    assert (
        exported.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False) == served
    )


def test_the_config_names_the_special_tokens(exported, model_server) -> None:
    tokenizer = model_server.engine.tokenizer
    assert exported.convert_tokens_to_ids(exported.eos_token) == tokenizer.eos_token_id
    assert exported.convert_tokens_to_ids(exported.bos_token) == tokenizer.bos_token_id
    assert len(exported) == tokenizer.vocab_size


def test_a_tokenizer_without_save_pretrained_is_a_one_line_error(tmp_path, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"tokenizer": "simple", "plugins": {"load": ["hetero_core.testing.reference"]}}))
    assert main(["export-tokenizer", str(tmp_path / "out"), "--config", str(config)]) == 2
    assert capsys.readouterr().err.strip() == (
        "hetero-infer: error: tokenizer 'simple' cannot be exported: it has no save_pretrained(directory)"
    )
    assert not (tmp_path / "out").exists()
