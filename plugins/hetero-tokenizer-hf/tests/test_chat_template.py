"""Chat templates render exactly as transformers renders them."""

from __future__ import annotations

import pytest

from hetero_core.errors import ConfigError, ValidationError
from hetero_tokenizer_hf import load_tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Hello!"}],
    [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Leaves fall slowly down"},
        {"role": "user", "content": "Another one, about the sea 🌊"},
    ],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": "  spaces\n\nand lines  "},
        {"role": "assistant", "content": "<|im_start|> inside text"},
        {"role": "user", "content": "{{ not a template }} {% raw %}"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_renders_as_transformers_does(embedded, reference, messages, add_generation_prompt: bool) -> None:
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert embedded.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected


def test_the_default_system_prompt_is_inserted(embedded) -> None:
    rendered = embedded.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


TEMPLATE_FEATURES = (
    "{{ bos_token }}{% for m in messages %}{% generation %}{{ m['content'] | tojson }}{% endgeneration %}"
    "{% if loop.last %}{% break %}{% endif %}{% endfor %}{% set ns = namespace(n=1) %}{{ ns.n }}"
    "{{ dict(a=1)['a'] }}{{ eos_token }}{{ pad_token }}{{ tools is none }}"
)


def test_template_features_render_as_in_transformers(write_gguf, load_reference) -> None:
    path = write_gguf(chat_template=TEMPLATE_FEATURES)
    messages = [{"role": "user", "content": "<b>é</b>"}, {"role": "user", "content": "b"}]
    expected = load_reference(path).apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert load_tokenizer(path).apply_chat_template(messages, add_generation_prompt=False) == expected
    assert expected == '<|im_start|>"<b>é</b>""b"11<|im_end|><|im_end|>True'


def test_raise_exception_becomes_a_validation_error(write_gguf) -> None:
    tokenizer = load_tokenizer(write_gguf(chat_template="{{ raise_exception('roles must alternate') }}"))
    with pytest.raises(ValidationError, match="roles must alternate"):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


def test_a_template_error_becomes_a_validation_error(write_gguf) -> None:
    tokenizer = load_tokenizer(write_gguf(chat_template="{{ messages[0]['content'].missing() }}"))
    with pytest.raises(ValidationError, match="cannot render"):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


def test_the_sandbox_refuses_private_attributes(write_gguf) -> None:
    tokenizer = load_tokenizer(write_gguf(chat_template="{{ messages.__class__.__mro__ }}"))
    with pytest.raises(ValidationError):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


def test_a_broken_template_is_a_config_error(write_gguf) -> None:
    with pytest.raises(ConfigError, match="does not compile"):
        load_tokenizer(write_gguf(chat_template="{% for m in messages %}"))
