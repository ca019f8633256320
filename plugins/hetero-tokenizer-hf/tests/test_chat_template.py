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


TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
NATIVE_TOOLS_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}[{{ m.role }}]{% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.function.name }}"
    "{{ c.function.arguments | tojson }}{% endfor %}{% else %}{{ m.content }}{% endif %}{% if m.role == 'tool' %}"
    " for {{ m.tool_call_id }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}{{ greeting }}"
)


def test_a_template_with_tool_support_renders_them_itself_as_in_transformers(write_gguf, load_reference) -> None:
    path = write_gguf(chat_template=NATIVE_TOOLS_TEMPLATE)
    expected = load_reference(path).apply_chat_template(
        TOOL_CONVERSATION, tools=[WEATHER], tokenize=False, add_generation_prompt=True, greeting="hi"
    )
    rendered = load_tokenizer(path).apply_chat_template(
        TOOL_CONVERSATION, tools=[WEATHER], template_kwargs={"greeting": "hi"}
    )
    assert rendered == expected
    assert (
        rendered.startswith("TOOLS:get_weather;[user]")
        and 'CALL get_weather{"city": "Paris"}' in rendered
        and "sunny for call_1" in rendered
    )


def test_a_template_without_tool_support_gets_the_default_convention(embedded) -> None:
    rendered = embedded.apply_chat_template(TOOL_CONVERSATION, tools=[WEATHER])
    assert rendered.startswith(
        "<|im_start|>system\nYou can call functions (tools)."
    )  # instead of the default system prompt
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in rendered
    )
    assert rendered.endswith(
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = embedded.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *TOOL_CONVERSATION], tools=[WEATHER]
    )
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\nYou can call functions")


@pytest.mark.parametrize("messages", CONVERSATIONS[2:])
def test_continue_final_message_cuts_as_transformers_does(embedded, reference, messages) -> None:
    chat = [*messages[:-1], {"role": "assistant", "content": "Partial answer "}]
    expected = reference.apply_chat_template(chat, tokenize=False, continue_final_message=True)
    assert embedded.apply_chat_template(chat, add_generation_prompt=False, continue_final_message=True) == expected


def test_continue_final_message_needs_text_to_continue(write_gguf) -> None:
    tokenizer = load_tokenizer(write_gguf(chat_template=NATIVE_TOOLS_TEMPLATE))
    with pytest.raises(ValidationError, match="continue_final_message"):  # a tool call, not text
        tokenizer.apply_chat_template(TOOL_CONVERSATION[:2], add_generation_prompt=False, continue_final_message=True)
    roles_only = load_tokenizer(write_gguf(chat_template="{% for m in messages %}{{ m.role }}{% endfor %}"))
    with pytest.raises(ValidationError, match="continue_final_message"):  # the template never shows the content
        roles_only.apply_chat_template(
            [{"role": "user", "content": "x"}], add_generation_prompt=False, continue_final_message=True
        )


def test_template_kwargs_cannot_replace_what_the_caller_sets(embedded) -> None:
    with pytest.raises(ValidationError, match="eos_token") as caught:
        embedded.apply_chat_template([{"role": "user", "content": "x"}], template_kwargs={"eos_token": "!"})
    assert caught.value.param == "chat_template_kwargs"
